#include "coord/adapter_select.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of a name quoted in a message: enough to recognise it, bounded so the message fits. */
static int quoted(const char *s) { return (int)(strlen(s) < 64 ? strlen(s) : 64); }

/* "'coder', 'tester'" (the adapters' names) into out, cut to fit. */
static void list_adapters(const LoraSet *lora, char *out, size_t cap) {
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; lora && i < lora->n && used + 1 < cap; i++) {
        if (!lora_set_get(lora, i + 1)) continue; /* unloaded at run time */
        int n = snprintf(out + used, cap - used, "%s'%.32s'", used ? ", " : "", lora->adapters[i].name);
        if (n < 0) break;
        used += (size_t)n;
    }
}

int adapter_select(ApiRequest *a, const char *served_model, const LoraSet *lora, ApiError *err) {
    char names[160];
    list_adapters(lora, names, sizeof names);
    if (a->model && strcmp(a->model, served_model) != 0) {
        if (lora_set_find(lora, a->model) <= 0)
            return api_error_set(err, 404, "model", "model_not_found", "The model '%.*s' does not exist; this server serves '%s'%s%s",
                                 quoted(a->model), a->model, served_model, names[0] ? " and the adapters " : "", names);
        if (a->adapter && strcmp(a->adapter, a->model) != 0)
            return api_error_set(err, 400, "adapter", NULL, "model names adapter '%.*s' but adapter names '%.*s'; send one of them",
                                 quoted(a->model), a->model, quoted(a->adapter), a->adapter);
        if (!a->adapter && !(a->adapter = strdup(a->model))) return api_error_set(err, 503, NULL, NULL, "the server is out of memory");
    }
    int id = a->adapter ? lora_set_find(lora, a->adapter) : 0;
    if (a->adapter && (id <= 0 || strchr(a->adapter, LORA_GENERATION_SEP)))
        return api_error_set(err, 404, "adapter", "adapter_not_found", "The adapter '%.*s' is not loaded on this server (%s%s)",
                             quoted(a->adapter), a->adapter, names[0] ? "loaded: " : "none loaded; start it with --lora NAME=PATH",
                             names);
    const LoraAdapter *ad = lora_set_get(lora, id);
    free(a->adapter_cache);
    a->adapter_cache = NULL;
    if (ad && ad->generation > 1) {
        char cache_name[LORA_CACHE_NAME_MAX];
        if (lora_cache_name(ad->name, ad->generation, cache_name, sizeof cache_name) || !(a->adapter_cache = strdup(cache_name)))
            return api_error_set(err, 503, NULL, NULL, "the server is out of memory");
    }
    return 0;
}
