#!/bin/bash
cat data/*.txt | wc -w > total.txt
