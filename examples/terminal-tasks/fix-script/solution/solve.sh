#!/bin/bash
sed -i 's/total=$((total + n)$/total=$((total + n))/' sum.sh
