#!/bin/bash
cd /app
if [ -f backup/records.txt ] && [ "$(cat backup/records.txt)" = "$(printf "maple\nhoney\njelly")" ] && [ -f count.txt ] && [ "$(grep -o "[0-9]\+" count.txt | head -1)" = "3" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
