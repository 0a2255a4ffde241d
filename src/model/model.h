/*
 * model.h — a loaded model: the GGUF mapping, its config, weight views, tokenizer and chat template.
 *
 * Owns all of them; braid_model_free() releases everything. Load errors name the file and the
 * problem. Thread-safety: read-only after load.
 */
#ifndef BRAID_MODEL_MODEL_H
#define BRAID_MODEL_MODEL_H

#include "common/error.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "model/model_weights.h"
#include "model/tokenizer.h"

typedef struct {
    GgufFile *gguf;
    ModelWeights weights; /* weights.cfg is the model's config */
    Tokenizer tokenizer;
    ChatTemplate chat;
} BraidModel;

/* path is a GGUF file, or a synthetic model's spec "synthetic:NAME[:TOKENIZER.gguf]"
 * (model/synthetic_model.h): its matrices have no data until a backend generates them. */
int braid_model_load(const char *path, BraidModel *model, BraidError *err);
void braid_model_free(BraidModel *model);

#endif
