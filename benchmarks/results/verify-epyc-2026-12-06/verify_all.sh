#!/bin/bash
# two queues of `fedfew study verify STUDY --budget B`, each study at the budget the last verify used
cd /work/verify-wt
export FEDFEW_DATA=/work/shared/data PYTHONUNBUFFERED=1 PYTHONPATH=/work/verify-wt/src
PY=/work/main/.venv/bin/python
queue() {
  while read study budget; do
    f=$(grep -l "^name: $study\$" studies/*.yaml | head -1)
    echo "=== $study $budget $f $(date +%T)"
    $PY -m fedfew study verify "$f" --budget "$budget" --runs /work/runs-verify
    echo "=== rc=$? $study $(date +%T)"
  done
}
queue < /work/verify_q1.txt > /work/verify_q1.log 2>&1 &
queue < /work/verify_q2.txt > /work/verify_q2.log 2>&1 &
wait
echo all done
