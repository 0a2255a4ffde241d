# braid-launch-lib.sh — what launch/braid-local and launch/braid-slurm share once their mpirun runs
# with --enable-recovery (sourced, not run). Under recovery a dead worker rank ends only its
# instance, but mpirun no longer ends the job when rank 0 dies, and exits 0 whatever its ranks
# return; these functions make up for both:
#   launch_forward           trap handler: the first SIGINT/SIGTERM goes to the coordinator at once
#                            (it stops accepting, drains and stops every rank), a second kills mpirun.
#   launch_watch_coordinator rank 0 gone for 5 s while mpirun runs: stop mpirun (TERM, then KILL).
#   launch_wait              waits for mpirun, watching the coordinator; sets `status` to the
#                            server's exit status (rank 0's --exit-status-file; 1 when the job ended
#                            without rank 0 writing it, i.e. it was killed).
# The caller sets: launcher (message prefix), mpirun_pid, pid_file (braid serve --pid-file),
# status_file (braid serve --exit-status-file) and rank0_here (1 when rank 0 runs on this host).
# Both files are on rank 0's node: seen here when this script runs there (braid-local; braid-slurm
# under sbatch). Elsewhere (salloc on a login node) the watch sees nothing, signals go to mpirun,
# and the status is mpirun's own.

launch_signalled=0
launch_forward() {
  if [ "$launch_signalled" = 1 ]; then kill -KILL "$mpirun_pid" 2> /dev/null; return; fi
  launch_signalled=1
  # The signal first, with builtins only (no fork): until it lands the server still accepts; the
  # coordinator stops accepting the moment it arrives (braid serve: a signal thread closes the
  # listening socket and answers 503 from then on).
  local coordinator=""
  [ -s "$pid_file" ] && read -r coordinator < "$pid_file"
  if [ -n "$coordinator" ] && kill -TERM "$coordinator" 2> /dev/null; then
    echo "$launcher: draining (a second signal aborts)" >&2
  else
    kill -TERM "$mpirun_pid" 2> /dev/null
  fi
}

launch_coordinator_gone_since=""
launch_watch_coordinator() {
  [ -s "$pid_file" ] && ! kill -0 "$(cat "$pid_file")" 2> /dev/null || { launch_coordinator_gone_since=""; return; }
  local now; now=$(date +%s)
  [ -n "$launch_coordinator_gone_since" ] || launch_coordinator_gone_since=$now
  # A normal exit takes the other ranks with it within a second; only then is mpirun stopped.
  [ $((now - launch_coordinator_gone_since)) -ge 5 ] || return
  echo "$launcher: the coordinator (rank 0) is gone; stopping the other ranks" >&2
  kill -TERM "$mpirun_pid" 2> /dev/null
  for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$mpirun_pid" 2> /dev/null || return; sleep 0.5; done
  kill -KILL "$mpirun_pid" 2> /dev/null
}

launch_wait() {
  # A short sleep in the background keeps the trap responsive (wait returns when a signal arrives).
  while kill -0 "$mpirun_pid" 2> /dev/null; do
    launch_watch_coordinator
    sleep 0.5 & wait $! 2> /dev/null
  done
  wait "$mpirun_pid"; status=$?
  if [ -s "$status_file" ]; then status=$(cat "$status_file")
  elif [ "$status" = 0 ] && [ "$rank0_here" = 1 ]; then status=1  # rank 0 ran here but never said how it ended
  fi
}
