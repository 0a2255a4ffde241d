/*
 * sched_admit.h — output-aware admission (braid serve / batch / sim --admit-output).
 *
 * The scheduler admits a request when its prompt's blocks fit; its decode then grows its block
 * table by one block every block_size tokens, and when the pool runs out mid-decode a running
 * request is preempted (its work is recomputed). An instance fed many small-prefill requests
 * (cache hits) admits more than it can finish that way. With output-aware admission the head of
 * the queue is admitted only when, once its prompt's blocks are held, the device pool still has
 * room (free + evictable cached blocks) for the expected rest of the output of every running
 * request and of the request itself. Expected output of a request = min(its max_tokens, E), E =
 * a fixed token count, or (auto) the mean output of the requests this scheduler has finished
 * (stop / length), each request's max_tokens until one has. A request that has already passed its
 * expectation expects nothing more (it is not reserved for again). When nothing runs, the head
 * is always admitted (sched_add checked that it fits alone), so the rule never stalls the queue.
 * Off (the default): admission on the prompt's blocks alone, as before.
 * Pure arithmetic on the scheduler's numbers; the scheduler (scheduler.c) calls it. Not thread-safe.
 */
#ifndef BRAID_WORKER_SCHED_ADMIT_H
#define BRAID_WORKER_SCHED_ADMIT_H

#include <stdbool.h>
#include <stdint.h>

#define SCHED_ADMIT_OUTPUT_OFF 0   /* admission on the prompt's blocks alone */
#define SCHED_ADMIT_OUTPUT_AUTO -1 /* E = the mean output of finished requests */

typedef struct {
    int output_tokens;      /* SCHED_ADMIT_OUTPUT_OFF, _AUTO, or E > 0 */
    uint64_t finished;      /* auto: requests learned from */
    uint64_t output_sum;    /* auto: their generated tokens */
    uint64_t deferrals;     /* admissions the rule held back (the head waited for room) */
} SchedAdmit;

/* --admit-output's text: "off", "auto" or a token count in [1, 1 << 20]. 0 and *mode set, or -1. */
int sched_admit_output_parse(const char *text, int *mode);
/* The mode's name as the option spells it ("off", "auto", or the count) into buf. */
const char *sched_admit_output_name(int mode, char *buf, int cap);
static inline bool sched_admit_on(const SchedAdmit *a) { return a->output_tokens != SCHED_ADMIT_OUTPUT_OFF; }
/* The output tokens a request with this max_tokens is expected to generate in all. */
int sched_admit_expected_output(const SchedAdmit *a, int max_tokens);
/* Blocks a sequence holding `held` blocks still needs for n_prompt + its expected output tokens. */
int sched_admit_blocks_due(const SchedAdmit *a, int n_prompt, int max_tokens, int held, int block_size);
/* A request finished with `generated` output tokens (stop or length): auto learns it. */
void sched_admit_learn(SchedAdmit *a, int generated);
/* The rule: defer when room (free + evictable blocks now) is below due (blocks the running
 * requests and the candidate still need), unless nothing runs. Counts the deferral. */
bool sched_admit_defer(SchedAdmit *a, int room, int due, int n_running);

#endif
