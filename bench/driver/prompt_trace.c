/* The live run's trace: prompts tokenized like the server, lines through trace_writer; see prompt_trace.h. */
#include "prompt_trace.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/synthetic_model.h"
#include "model/tokenizer.h"
#include "sim/trace_writer.h"

struct PromptTrace {
    GgufFile *gguf;        /* the tokenizer's strings point into it */
    Tokenizer tokenizer;
    bool tokenizer_loaded;
    FILE *out;
    char *path;
    int block_size;
    pthread_mutex_t write_mu;
    bool write_failed;
};

static void free_trace(PromptTrace *t) {
    if (t->tokenizer_loaded) tokenizer_free(&t->tokenizer);
    gguf_close(t->gguf);
    pthread_mutex_destroy(&t->write_mu);
    free(t->path);
    free(t);
}

PromptTrace *prompt_trace_open(const char *model_path, const char *out_path, int block_size, BraidError *err) {
    PromptTrace *t = calloc(1, sizeof *t);
    if (!t) return braid_error_set(err, "trace: out of memory"), NULL;
    pthread_mutex_init(&t->write_mu, NULL);
    t->block_size = block_size;
    char synthetic_tokenizer[4096]; /* a synthetic:NAME server tokenizes with its tokenizer GGUF */
    if (synthetic_model_spec(model_path)) {
        if (synthetic_model_tokenizer_path(model_path, synthetic_tokenizer, sizeof synthetic_tokenizer, err)) {
            free_trace(t);
            return NULL;
        }
        model_path = synthetic_tokenizer;
    }
    if (gguf_open(model_path, &t->gguf, err) || tokenizer_load(t->gguf, &t->tokenizer, err)) {
        braid_error_wrap(err, "loading the tokenizer from %s", model_path);
        free_trace(t);
        return NULL;
    }
    t->tokenizer_loaded = true;
    t->path = strdup(out_path);
    if (!t->path || !(t->out = fopen(out_path, "w"))) {
        braid_error_set(err, "cannot write %s", out_path);
        free_trace(t);
        return NULL;
    }
    return t;
}

int prompt_trace_request(PromptTrace *t, const PromptTraceRequest *req, int *prompt_tokens, BraidError *err) {
    TokenList ids = {0};
    /* As /v1/completions: parse_special false, the model's own add_bos. */
    if (tokenizer_encode(&t->tokenizer, req->prompt, strlen(req->prompt), false, t->tokenizer.add_bos, &ids, err)) {
        free(ids.ids);
        return braid_error_wrap(err, "trace: tokenizing the prompt of %s", req->id ? req->id : "a request");
    }
    *prompt_tokens = ids.n;
    TraceRecord rec = {.seq = req->seq, .t = req->t, .id = req->id, .workflow = req->workflow, .agent = req->agent,
                       .tenant = req->tenant, .adapter = req->adapter, .prompt = ids.ids, .prompt_tokens = ids.n,
                       .output_tokens = req->output_tokens, .block_size = t->block_size};
    pthread_mutex_lock(&t->write_mu);
    int rc = trace_write_request(t->out, &rec);
    if (rc) t->write_failed = true;
    pthread_mutex_unlock(&t->write_mu);
    free(ids.ids);
    return rc ? braid_error_set(err, "trace: cannot write the line of %s to %s", req->id ? req->id : "a request", t->path) : 0;
}

int prompt_trace_workflow_end(PromptTrace *t, double t_s, const char *workflow, BraidError *err) {
    pthread_mutex_lock(&t->write_mu);
    int rc = trace_write_workflow_end(t->out, t_s, workflow);
    if (rc) t->write_failed = true;
    pthread_mutex_unlock(&t->write_mu);
    return rc ? braid_error_set(err, "trace: cannot write the end of workflow %s to %s", workflow, t->path) : 0;
}

int prompt_trace_close(PromptTrace *t, BraidError *err) {
    if (!t) return 0;
    bool failed = t->write_failed;
    if (t->out && fclose(t->out) != 0) failed = true;
    int rc = failed ? braid_error_set(err, "error writing %s", t->path) : 0;
    free_trace(t);
    return rc;
}
