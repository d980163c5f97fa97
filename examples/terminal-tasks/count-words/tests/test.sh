#!/bin/bash
# 6 + 3 + 4 words; the first number in total.txt counts.
if [ "$(grep -o '[0-9]\+' /app/total.txt 2>/dev/null | head -1)" = "13" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
