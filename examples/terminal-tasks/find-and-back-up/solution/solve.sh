#!/bin/bash
cd /app
mkdir -p backup && f=$(grep -l honey notes/*) && cp $f backup/ && wc -l < $f > count.txt
