/*
 * engine_probe.h — the online probe of approximate segment reuse (sched_span_guard.h), run by the
 * engine around a step's forward.
 *
 * A request whose next span is PROBING has the span's cached, delta-RoPE-rotated keys in its
 * slots (the COPY_SLOTS operations ran) and computes the span's head in this step or the next.
 * before: reads the cached keys of the probe tokens this step computes (backend_read_block);
 * after (post-forward, before sched_commit): reads the fresh keys the forward wrote over them with
 * the true left context, adds their per-layer cosines, and once the probe tokens are all done
 * tells the scheduler (sched_span_probe_result): rejected when some layer's mean cosine is below
 * the configured minimum. Reads are synchronous (slow on CUDA: one per probed block); with tensor
 * parallelism the leader compares its own shard's KV heads.
 */
#ifndef BRAID_WORKER_ENGINE_PROBE_H
#define BRAID_WORKER_ENGINE_PROBE_H

#include "common/error.h"
#include "worker/engine.h"

int engine_probe_before(Engine *e, BraidError *err);
int engine_probe_after(Engine *e, BraidError *err);

#endif
