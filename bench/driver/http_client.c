/* One streamed completion over libcurl; the contract is in http_client.h. */
#include "http_client.h"

#include <curl/curl.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/timeutil.h"
#include "sleep_util.h"
#include "sse_reader.h"
#include "strbuf.h"
#include "text_copy.h"

#define RETRY_AFTER_DEFAULT_S 1.0
#define RETRY_AFTER_MAX_S 60.0
#define ERROR_BODY_MAX_BYTES (64 * 1024) /* an error body beyond this is cut: only its message matters */

struct HttpClient {
    CURL *curl;
    char *base_url;
    int max_retries;
    struct curl_slist *headers;
    char curl_error[CURL_ERROR_SIZE];
};

/* What one attempt has seen so far; filled by libcurl's callbacks. */
typedef struct {
    HttpResult *res;
    bool streaming;          /* parse a 200 body as SSE (completions) or keep it raw (workflow end) */
    int status;
    double retry_after_s;
    bool done;               /* "data: [DONE]" arrived */
    SseReader sse;
    StrBuf text;             /* the generated text so far, handed to res->text at the end */
    char *raw;               /* a body that is not an SSE stream (errors), at most ERROR_BODY_MAX_BYTES */
    size_t raw_len;
    BraidError err;          /* why the stream was stopped from inside a callback */
    bool stream_failed;
    bool got_response_byte;  /* any byte of an answer (status line, header or body) arrived */
    bool new_socket;         /* libcurl opened a socket since the last send */
    bool last_send_reused;   /* the latest send went out on a connection kept from before */
    int sends;               /* sends libcurl made in this perform (more than one: it resent by itself) */
    int *resends_left;       /* the request's resend budget (1), shared by libcurl's resends and ours */
    bool resend_refused;     /* libcurl wanted to resend once more; the pre-request callback said no */
} Exchange;

/* ---- process-wide set-up ---- */

int http_client_global_init(BraidError *err) {
    CURLcode rc = curl_global_init(CURL_GLOBAL_DEFAULT);
    return rc == CURLE_OK ? 0 : braid_error_set(err, "libcurl: global init failed: %s", curl_easy_strerror(rc));
}

void http_client_global_cleanup(void) { curl_global_cleanup(); }

/* ---- clients ---- */

/* "http://h:p/", "http://h:p/v1" and "http://h:p/v1/" all name the server at "http://h:p". */
static char *normalized_base_url(const char *url) {
    char *copy = strdup(url);
    if (!copy) return NULL;
    size_t n = strlen(copy);
    while (n > 0 && copy[n - 1] == '/') copy[--n] = '\0';
    if (n >= 3 && strcmp(copy + n - 3, "/v1") == 0) copy[n -= 3] = '\0';
    while (n > 0 && copy[n - 1] == '/') copy[--n] = '\0';
    return copy;
}

HttpClient *http_client_create(const char *base_url, int max_retries, BraidError *err) {
    HttpClient *c = calloc(1, sizeof *c);
    if (!c) return braid_error_set(err, "http client: out of memory"), NULL;
    c->max_retries = max_retries;
    c->base_url = normalized_base_url(base_url);
    c->curl = curl_easy_init();
    /* "Expect:" turns off curl's 100-continue handshake, which would delay every large prompt. */
    static const char *const header_lines[] = {"Content-Type: application/json", "Accept: text/event-stream", "Expect:"};
    for (size_t i = 0; i < sizeof header_lines / sizeof header_lines[0]; i++) {
        struct curl_slist *grown = curl_slist_append(c->headers, header_lines[i]);
        if (!grown) break;
        c->headers = grown;
    }
    if (!c->base_url || !c->curl || !c->headers) {
        http_client_free(c);
        return braid_error_set(err, "http client: cannot set up a libcurl handle for %s", base_url), NULL;
    }
    return c;
}

void http_client_free(HttpClient *c) {
    if (!c) return;
    if (c->curl) curl_easy_cleanup(c->curl);
    curl_slist_free_all(c->headers);
    free(c->base_url);
    free(c);
}

void http_result_free(HttpResult *r) {
    if (!r) return;
    free(r->text);
    r->text = NULL;
    r->text_len = 0;
    free(r->chunk_times);
    r->chunk_times = NULL;
    r->n_chunks = 0;
}

/* Appends one chunk arrival time; losing one to a failed allocation only thins the ITL samples. */
static void note_chunk_time(HttpResult *r, double t) {
    if ((r->n_chunks & (r->n_chunks - 1)) == 0) { /* 0, 1, 2, 4, ...: grow to the next power of two */
        size_t cap = r->n_chunks ? 2 * (size_t)r->n_chunks : 8;
        double *grown = realloc(r->chunk_times, cap * sizeof *grown);
        if (!grown) return;
        r->chunk_times = grown;
    }
    r->chunk_times[r->n_chunks++] = t;
}

/* ---- reading one chunk of the stream ---- */

static int append_text(Exchange *x, const char *piece, size_t n) {
    strbuf_append_n(&x->text, piece, n);
    if (strbuf_failed(&x->text))
        return braid_error_set(&x->err, "out of memory holding %zu bytes of generated text", x->text.len + n);
    return 0;
}

/* The text a chunk carries: "text" for completions, "delta"."content" for chat. */
static const json_t *chunk_text(const json_t *choice) {
    const json_t *text = json_object_get(choice, "text");
    if (json_is_string(text)) return text;
    const json_t *content = json_object_get(json_object_get(choice, "delta"), "content");
    return json_is_string(content) ? content : NULL;
}

static int int_or(const json_t *v, int fallback) { return json_is_integer(v) ? (int)json_integer_value(v) : fallback; }

static void read_usage(HttpResult *r, const json_t *usage) {
    if (!json_is_object(usage)) return;
    r->prompt_tokens = int_or(json_object_get(usage, "prompt_tokens"), r->prompt_tokens);
    r->completion_tokens = int_or(json_object_get(usage, "completion_tokens"), r->completion_tokens);
    const json_t *details = json_object_get(usage, "prompt_tokens_details");
    r->cached_tokens = int_or(json_object_get(details, "cached_tokens"), r->cached_tokens < 0 ? 0 : r->cached_tokens);
    r->segment_reused_tokens = int_or(json_object_get(details, "segment_reused_tokens"), r->segment_reused_tokens);
}

static int read_choice(Exchange *x, const json_t *choice, double now) {
    const json_t *text = chunk_text(choice);
    if (text && json_string_length(text) > 0) {
        if (x->res->t_first_text == 0) x->res->t_first_text = now;
        note_chunk_time(x->res, now);
        if (append_text(x, json_string_value(text), json_string_length(text))) return -1;
    }
    const json_t *finish = json_object_get(choice, "finish_reason");
    if (json_is_string(finish)) snprintf(x->res->finish_reason, sizeof x->res->finish_reason, "%s", json_string_value(finish));
    return 0;
}

/* One "data:" payload: [DONE], an error event, or a chunk with text, finish reason and/or usage. */
static int on_sse_data(void *ctx, const char *payload, size_t len, BraidError *err) {
    Exchange *x = ctx;
    double now = braid_now_seconds();
    if (strcmp(payload, "[DONE]") == 0) {
        x->done = true;
        return 0;
    }
    json_error_t jerr;
    json_t *chunk = json_loadb(payload, len, 0, &jerr);
    if (!json_is_object(chunk)) {
        json_decref(chunk);
        return braid_error_set(err, "malformed stream chunk (%s): %.80s", chunk ? "not an object" : jerr.text, payload);
    }
    int rc = 0;
    const json_t *error = json_object_get(chunk, "error");
    if (error) {
        const char *msg = json_string_value(json_object_get(error, "message"));
        snprintf(x->res->error, sizeof x->res->error, "error event in the stream: %s", msg ? msg : "(no message)");
        x->stream_failed = true;
    }
    const json_t *choices = json_object_get(chunk, "choices");
    if (json_array_size(choices) > 0) rc = read_choice(x, json_array_get(choices, 0), now);
    read_usage(x->res, json_object_get(chunk, "usage"));
    json_decref(chunk);
    return rc; /* read_choice reports into x->err, which is err */
}

/* ---- libcurl callbacks ---- */

static size_t on_header(char *line, size_t size, size_t nmemb, void *ctx) {
    Exchange *x = ctx;
    size_t n = size * nmemb;
    x->got_response_byte = true;
    char buf[256];
    size_t k = n < sizeof buf - 1 ? n : sizeof buf - 1;
    memcpy(buf, line, k);
    buf[k] = '\0';
    int status;
    if (strncmp(buf, "HTTP/", 5) == 0 && sscanf(buf, "HTTP/%*s %d", &status) == 1) {
        x->status = status; /* a new status line starts a new response (after a redirect or 100) */
        x->retry_after_s = RETRY_AFTER_DEFAULT_S;
    } else if (strncasecmp(buf, "Retry-After:", 12) == 0) {
        char *end;
        double s = strtod(buf + 12, &end);
        /* An HTTP-date form does not parse as a number; the default applies then. */
        if (end != buf + 12 && s >= 0) x->retry_after_s = s < RETRY_AFTER_MAX_S ? s : RETRY_AFTER_MAX_S;
    }
    return n;
}

static void keep_raw(Exchange *x, const char *bytes, size_t n) {
    if (x->raw_len + n > ERROR_BODY_MAX_BYTES) n = ERROR_BODY_MAX_BYTES - x->raw_len;
    if (n == 0) return;
    char *grown = realloc(x->raw, x->raw_len + n + 1);
    if (!grown) return; /* the body only serves the error message; losing it is not fatal */
    x->raw = grown;
    memcpy(x->raw + x->raw_len, bytes, n);
    x->raw_len += n;
    x->raw[x->raw_len] = '\0';
}

static size_t on_body(char *bytes, size_t size, size_t nmemb, void *ctx) {
    Exchange *x = ctx;
    size_t n = size * nmemb;
    x->got_response_byte = true;
    if (!x->streaming || x->status != 200) {
        keep_raw(x, bytes, n);
        return n;
    }
    /* Returning less than n makes curl stop the transfer with CURLE_WRITE_ERROR. */
    return sse_reader_feed(&x->sse, bytes, n, on_sse_data, x, &x->err) ? 0 : n;
}

/* A new socket: the next send goes out on a fresh connection. */
static int on_socket(void *ctx, curl_socket_t fd, curlsocktype purpose) {
    (void)fd, (void)purpose;
    ((Exchange *)ctx)->new_socket = true;
    return CURL_SOCKOPT_OK;
}

/* Called before every send of the request, libcurl's own resends included. A send beyond the
 * first is libcurl resending after a reused connection died before any byte of answer: it takes
 * the request's one resend, and is refused (the transfer aborts) when that is spent. */
static int on_before_send(void *ctx, char *primary_ip, char *local_ip, int primary_port, int local_port) {
    (void)primary_ip, (void)local_ip, (void)primary_port, (void)local_port;
    Exchange *x = ctx;
    if (x->sends++ > 0) {
        if (*x->resends_left <= 0) {
            x->resend_refused = true;
            return CURL_PREREQFUNC_ABORT;
        }
        (*x->resends_left)--;
        x->res->connection_retries++;
    }
    x->last_send_reused = !x->new_socket;
    x->new_socket = false;
    return CURL_PREREQFUNC_OK;
}

/* ---- attempts ---- */

static void exchange_reset(Exchange *x) {
    sse_reader_free(&x->sse);
    strbuf_free(&x->text);
    free(x->raw);
    HttpResult *res = x->res;
    bool streaming = x->streaming;
    int *resends_left = x->resends_left;
    *x = (Exchange){.res = res, .streaming = streaming, .retry_after_s = RETRY_AFTER_DEFAULT_S, .resends_left = resends_left};
}

/* Whether a failed attempt may go out again: it went out on a reused connection, no byte of an
 * answer came, the failure is the connection's (not ours), and the resend is still unspent. */
static bool safe_to_resend(CURLcode rc, const Exchange *x) {
    bool connection_died = rc == CURLE_GOT_NOTHING || rc == CURLE_SEND_ERROR || rc == CURLE_RECV_ERROR;
    return connection_died && !x->got_response_byte && x->last_send_reused && !x->resend_refused && *x->resends_left > 0;
}

/* Runs one POST of body (len bytes) to url. Returns the CURLcode; x holds what came back. */
static CURLcode perform(HttpClient *c, const char *url, const char *body, size_t len, Exchange *x) {
    CURL *h = c->curl;
    c->curl_error[0] = '\0';
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, c->headers);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, c->curl_error);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L); /* no SIGALRM for timeouts: several clients share the process */
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(h, CURLOPT_SOCKOPTFUNCTION, on_socket);
    curl_easy_setopt(h, CURLOPT_SOCKOPTDATA, x);
    curl_easy_setopt(h, CURLOPT_PREREQFUNCTION, on_before_send);
    curl_easy_setopt(h, CURLOPT_PREREQDATA, x);
    CURLcode rc = curl_easy_perform(h);
    if (rc != CURLE_OK && safe_to_resend(rc, x)) {
        /* The connection was closed under the request (an idle timeout racing it): once more on a
         * fresh one. libcurl gives up on its own after a few such deaths over a handle's life. */
        (*x->resends_left)--;
        x->res->connection_retries++;
        exchange_reset(x);
        curl_easy_setopt(h, CURLOPT_FRESH_CONNECT, 1L);
        rc = curl_easy_perform(h);
        curl_easy_setopt(h, CURLOPT_FRESH_CONNECT, 0L);
    }
    return rc;
}

/* The message of an OpenAI error body, else the start of the body, else the bare status. */
static void describe_http_error(const Exchange *x, char *out, size_t cap) {
    json_t *body = x->raw ? json_loadb(x->raw, x->raw_len, 0, NULL) : NULL;
    const char *msg = json_string_value(json_object_get(json_object_get(body, "error"), "message"));
    if (msg) snprintf(out, cap, "HTTP %d: %s", x->status, msg);
    else if (x->raw_len > 0) snprintf(out, cap, "HTTP %d: %.200s", x->status, x->raw);
    else snprintf(out, cap, "HTTP %d with an empty body", x->status);
    json_decref(body);
}

static void describe_transport_error(const HttpClient *c, CURLcode rc, const Exchange *x, char *out, size_t cap) {
    if (rc == CURLE_WRITE_ERROR && x->err.msg[0]) text_copy(out, cap, x->err.msg);
    else if (x->resend_refused)
        snprintf(out, cap, "the connection died before any byte of the answer, again after the one resend on a fresh connection");
    else snprintf(out, cap, "%s: %s", curl_easy_strerror(rc), c->curl_error[0] ? c->curl_error : "no details");
}

/* After the last attempt: whether it succeeded, and if not, why (into res->error). */
static int conclude(const HttpClient *c, CURLcode rc, const Exchange *x, HttpResult *res) {
    if (rc != CURLE_OK) {
        describe_transport_error(c, rc, x, res->error, sizeof res->error);
        return -1;
    }
    if (x->status != 200) {
        describe_http_error(x, res->error, sizeof res->error);
        return -1;
    }
    if (x->stream_failed) return -1; /* res->error already holds the event's message */
    if (!x->done) {
        snprintf(res->error, sizeof res->error, "the stream ended without data: [DONE]");
        return -1;
    }
    return 0;
}

static char *url_for(const HttpClient *c, const char *path) {
    size_t n = strlen(c->base_url) + strlen(path) + 1;
    char *url = malloc(n);
    if (url) snprintf(url, n, "%s%s", c->base_url, path);
    return url;
}

static char *streaming_body(json_t *body) {
    json_t *opts = json_pack("{s:b}", "include_usage", 1);
    if (!opts || json_object_set_new(body, "stream", json_true()) || json_object_set_new(body, "stream_options", opts)) return NULL;
    return json_dumps(body, JSON_COMPACT);
}

int http_client_complete(HttpClient *c, const char *path, json_t *body, HttpResult *out) {
    *out = (HttpResult){.prompt_tokens = -1, .completion_tokens = -1, .cached_tokens = -1};
    char *url = url_for(c, path), *payload = streaming_body(body);
    out->t_send = braid_now_seconds();
    if (!url || !payload) {
        snprintf(out->error, sizeof out->error, "out of memory preparing the request");
        out->t_end = out->t_send;
        free(url), free(payload);
        return -1;
    }
    int resends_left = 1;
    Exchange x = {.res = out, .streaming = true, .resends_left = &resends_left};
    CURLcode rc;
    for (;;) {
        exchange_reset(&x);
        rc = perform(c, url, payload, strlen(payload), &x);
        out->status = x.status;
        if (rc != CURLE_OK || x.status != 429 || out->retries >= c->max_retries) break;
        out->retries++;
        sleep_seconds(x.retry_after_s);
    }
    out->t_end = braid_now_seconds();
    int result = conclude(c, rc, &x, out);
    out->text_len = x.text.len;
    out->text = strbuf_take(&x.text); /* "" when nothing came */
    if (!out->text) {
        out->text_len = 0;
        if (result == 0) snprintf(out->error, sizeof out->error, "out of memory holding the generated text");
        result = -1;
    }
    exchange_reset(&x);
    free(url);
    free(payload);
    return result;
}

int http_client_end_workflow(HttpClient *c, const char *workflow, int *status, BraidError *err) {
    *status = 0;
    char *escaped = curl_easy_escape(c->curl, workflow, 0);
    size_t n = (escaped ? strlen(escaped) : 0) + 32;
    char *path = malloc(n);
    if (!escaped || !path) {
        curl_free(escaped);
        free(path);
        return braid_error_set(err, "workflow %s: out of memory building the end URL", workflow);
    }
    snprintf(path, n, "/v1/workflows/%s/end", escaped);
    curl_free(escaped);
    char *url = url_for(c, path);
    free(path);
    if (!url) return braid_error_set(err, "workflow %s: out of memory building the end URL", workflow);
    HttpResult scratch = {0};
    int resends_left = 1;
    Exchange x = {.res = &scratch, .streaming = false, .resends_left = &resends_left};
    exchange_reset(&x);
    CURLcode rc = perform(c, url, "", 0, &x);
    *status = rc == CURLE_OK ? x.status : 0;
    int result = 0;
    if (rc != CURLE_OK || x.status != 200) {
        char why[320];
        if (rc != CURLE_OK) describe_transport_error(c, rc, &x, why, sizeof why);
        else describe_http_error(&x, why, sizeof why);
        result = braid_error_set(err, "POST %s: %s", url, why);
    }
    exchange_reset(&x);
    free(url);
    return result;
}
