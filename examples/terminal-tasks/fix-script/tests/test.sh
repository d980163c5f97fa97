#!/bin/bash
# Two checks, reported as reward.json: the script's output, and that it still reads the file.
out=$(cd /srv/work && timeout 5 bash sum.sh 2>/dev/null)
runs=0; [ "$out" = "108" ] && runs=1
reads=0; grep -q NUMBERS_FILE /srv/work/sum.sh && reads=1
echo "{\"reward\": $((runs * reads)), \"prints_sum\": $runs, \"reads_file\": $reads}" > /logs/verifier/reward.json
