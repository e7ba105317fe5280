#!/usr/bin/env bash
# A rank that dies or hangs mid-training: the two other ranks must stop with the documented error
# within the timeout, and rank 0's last checkpoint must still load (the checks are in test_mpi.cpp).
# --enable-recovery keeps Open MPI from killing the survivors itself when a rank dies, so that what
# is tested is the library's own timeout.
#   mpi_failure.sh MPIRUN PROGRAM dies|hangs
set -u
mpirun=$1 program=$2 how=$3
output=$(timeout 120 "$mpirun" --allow-run-as-root --oversubscribe --bind-to none --enable-recovery -np 3 \
    "$program" "$how" 2>&1)
grep -v "PMIX ERROR" <<< "$output"
good=$(grep -c "stopped as documented" <<< "$output")
if [ "$good" -eq 2 ]; then
    echo "rank 1 $how: both other ranks stopped with the documented error"
    exit 0
fi
echo "rank 1 $how: expected 2 ranks to stop with the documented error, saw $good"
exit 1
