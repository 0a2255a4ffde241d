# rank_pid.sh — rank_pid R: the pid of MPI rank R of the cluster serving on $port with the binary
# $braid (read from each rank's environment, OMPI_COMM_WORLD_RANK). Sourced, not run; shared by the
# tests that kill one rank (test_instance_failure.sh, test_slurm.sh).
rank_pid() {
  local p
  for p in $(pgrep -f "$braid serve .*--port $port( |\$)"); do
    tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$p"; return 0; }
  done
  return 1
}
