#!/bin/bash
total=0
while read -r n; do
  total=$((total + n)
done < "$NUMBERS_FILE"
echo "$total"
