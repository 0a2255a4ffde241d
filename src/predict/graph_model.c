#include "predict/graph_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Where each tensor lives in the one flat parameter array (so Adam and the gradient test see one
 * vector). Row-major; W is (out, in). */
typedef struct {
    size_t E, W1, b1, W2, b2, Wq, Wt, bt, Wm1, bm1, Wm2, bm2, total;
} Layout;

struct GraphModel {
    GraphModelShape s;
    int P;   /* V + 1: agents plus UNKNOWN (inputs) or END (outputs) */
    int Z;   /* width of the head's input: 3d + LEN_BUCKETS (+ dt with text); see the z layout below */
    int KO;  /* K * (V + 1) logits */
    Layout at;
    float *params;
    float *adj;               /* (P, P) row-normalized */
    float *text_mean, *text_inv_std; /* (D) */
    /* frozen inference tables */
    float *H2;                /* (P, d) */
    float *Q;                 /* (P, d): Wq H2[v] */
    float *C;                 /* (P, mlp): Wm1[:, :d] H2[v] + bm1 */
};

/* The head's input z = [h_cur | h_prev | h_path | length bucket (one-hot) | h_txt]. Beyond the
 * paper's three streams: the previous agent's embedding, because attention over a long history
 * blurs the order of the last two calls (which agent follows a tester depends on whether the
 * tester has just run or is summarizing), and the workflow's length so far in buckets, because
 * workflows end at their frameworks' step limits. */
#define LEN_BUCKETS 8
static int z_prev(const GraphModel *m) { return m->s.dim; }
static int z_path(const GraphModel *m) { return 2 * m->s.dim; }
static int z_len(const GraphModel *m) { return 3 * m->s.dim; }
static int z_txt(const GraphModel *m) { return 3 * m->s.dim + LEN_BUCKETS; }

static int length_bucket(int n) {
    static const int upper[LEN_BUCKETS - 1] = {1, 2, 4, 8, 12, 16, 24};
    for (int b = 0; b < LEN_BUCKETS - 1; b++)
        if (n <= upper[b]) return b;
    return LEN_BUCKETS - 1;
}

/* ---------------------------------------------------------------- small dense helpers */

/* Dot product in 8 independent lanes, which the compiler turns into vector instructions (a single
 * running sum cannot be reordered without -ffast-math); forecasts are dominated by these. */
static float dot(const float *a, const float *b, int n) {
    float lane[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) lane[l] += a[i + l] * b[i + l];
    float acc = ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
    for (; i < n; i++) acc += a[i] * b[i];
    return acc;
}

/* y (out) = W (out, in) x (+ b when b != NULL) */
static void matvec(float *y, const float *W, const float *b, const float *x, int out, int in) {
    for (int o = 0; o < out; o++) y[o] = (b ? b[o] : 0.0f) + dot(W + (size_t)o * in, x, in);
}

/* x (in) += W^T (out, in) dy (out) */
static void matvec_t_add(float *x, const float *W, const float *dy, int out, int in) {
    for (int o = 0; o < out; o++) {
        const float *w = W + (size_t)o * in;
        float g = dy[o];
        if (g == 0.0f) continue;
        for (int i = 0; i < in; i++) x[i] += w[i] * g;
    }
}

/* dW (out, in) += dy (out) outer x (in) */
static void outer_add(float *dW, const float *dy, const float *x, int out, int in) {
    for (int o = 0; o < out; o++) {
        float g = dy[o];
        if (g == 0.0f) continue;
        float *w = dW + (size_t)o * in;
        for (int i = 0; i < in; i++) w[i] += g * x[i];
    }
}

static void relu(float *x, int n) {
    for (int i = 0; i < n; i++)
        if (x[i] < 0.0f) x[i] = 0.0f;
}

/* In place softmax of n logits; returns log of the normalizer (for the loss). */
static double softmax(float *x, int n) {
    float mx = x[0];
    for (int i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)x[i] - mx);
    for (int i = 0; i < n; i++) x[i] = (float)(exp((double)x[i] - mx) / sum);
    return mx + log(sum);
}

static uint64_t rng_next(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_uniform(uint64_t *state) { return (float)((rng_next(state) >> 11) * (1.0 / 9007199254740992.0)); }

/* ---------------------------------------------------------------- shape, creation */

void graph_model_shape_defaults(GraphModelShape *s) {
    if (s->dim <= 0) s->dim = 32;
    if (s->text_out <= 0) s->text_out = 32;
    if (s->mlp <= 0) s->mlp = 128;
    if (s->max_history <= 0) s->max_history = 16;
}

static int check_shape(const GraphModelShape *s, BraidError *err) {
    if (s->n_agents < 1 || s->n_agents > GRAPH_MODEL_MAX_AGENTS)
        return braid_error_set(err, "graph model: %d agents (1..%d)", s->n_agents, GRAPH_MODEL_MAX_AGENTS);
    if (s->k < 1 || s->k > GRAPH_MODEL_MAX_K) return braid_error_set(err, "graph model: K = %d (1..%d)", s->k, GRAPH_MODEL_MAX_K);
    if (s->text_dim < 0 || s->text_dim > GRAPH_MODEL_MAX_TEXT_DIM)
        return braid_error_set(err, "graph model: hidden-state width %d (0..%d)", s->text_dim, GRAPH_MODEL_MAX_TEXT_DIM);
    if (s->dim < 1 || s->dim > 1024 || s->text_out < 1 || s->text_out > 1024 || s->mlp < 1 || s->mlp > 4096 || s->max_history < 1 ||
        s->max_history > 1024)
        return braid_error_set(err, "graph model: layer widths out of range (d %d, dt %d, mlp %d, history %d)", s->dim, s->text_out,
                               s->mlp, s->max_history);
    return 0;
}

static void layout(GraphModel *m) {
    const GraphModelShape *s = &m->s;
    size_t d = (size_t)s->dim, P = (size_t)m->P, H = (size_t)s->mlp, n = 0;
    Layout *L = &m->at;
    L->E = n, n += P * d;
    L->W1 = n, n += d * 2 * d;
    L->b1 = n, n += d;
    L->W2 = n, n += d * 2 * d;
    L->b2 = n, n += d;
    L->Wq = n, n += d * d;
    L->Wt = n, n += s->text_dim ? (size_t)s->text_out * s->text_dim : 0;
    L->bt = n, n += s->text_dim ? (size_t)s->text_out : 0;
    L->Wm1 = n, n += H * m->Z;
    L->bm1 = n, n += H;
    L->Wm2 = n, n += (size_t)m->KO * H;
    L->bm2 = n, n += (size_t)m->KO;
    L->total = n;
}

/* Glorot-uniform weights, zero biases, small embeddings. */
static void init_params(GraphModel *m, uint64_t seed) {
    const GraphModelShape *s = &m->s;
    uint64_t st = seed ^ 0x5eed0fa9e7ull;
    struct { size_t at; int out, in; } w[] = {
        {m->at.E, m->P, s->dim}, {m->at.W1, s->dim, 2 * s->dim}, {m->at.W2, s->dim, 2 * s->dim}, {m->at.Wq, s->dim, s->dim},
        {m->at.Wt, s->text_out, s->text_dim}, {m->at.Wm1, s->mlp, m->Z}, {m->at.Wm2, m->KO, s->mlp},
    };
    memset(m->params, 0, m->at.total * sizeof *m->params);
    for (size_t t = 0; t < sizeof w / sizeof w[0]; t++) {
        if (w[t].in == 0) continue;
        float a = sqrtf(6.0f / (float)(w[t].out + w[t].in));
        for (size_t i = 0; i < (size_t)w[t].out * w[t].in; i++) m->params[w[t].at + i] = (2.0f * rng_uniform(&st) - 1.0f) * a;
    }
}

int graph_model_create(GraphModel **out, const GraphModelShape *shape, uint64_t seed, BraidError *err) {
    *out = NULL;
    GraphModelShape s = *shape;
    graph_model_shape_defaults(&s);
    if (check_shape(&s, err)) return -1;
    GraphModel *m = calloc(1, sizeof *m);
    if (!m) return braid_error_set(err, "graph model: out of memory");
    m->s = s;
    m->P = s.n_agents + 1;
    m->Z = 3 * s.dim + LEN_BUCKETS + (s.text_dim ? s.text_out : 0);
    m->KO = s.k * m->P;
    layout(m);
    size_t P = (size_t)m->P, D = (size_t)s.text_dim;
    m->params = malloc(m->at.total * sizeof *m->params);
    m->adj = calloc(P * P, sizeof *m->adj);
    m->text_mean = calloc(D ? D : 1, sizeof *m->text_mean);
    m->text_inv_std = malloc((D ? D : 1) * sizeof *m->text_inv_std);
    m->H2 = malloc(P * s.dim * sizeof *m->H2);
    m->Q = malloc(P * s.dim * sizeof *m->Q);
    m->C = malloc(P * s.mlp * sizeof *m->C);
    if (!m->params || !m->adj || !m->text_mean || !m->text_inv_std || !m->H2 || !m->Q || !m->C) {
        size_t total = m->at.total;
        graph_model_free(m);
        return braid_error_set(err, "graph model: out of memory for %zu parameters", total);
    }
    for (size_t i = 0; i < (D ? D : 1); i++) m->text_inv_std[i] = 1.0f;
    init_params(m, seed);
    graph_model_freeze(m);
    *out = m;
    return 0;
}

void graph_model_free(GraphModel *m) {
    if (!m) return;
    free(m->params);
    free(m->adj);
    free(m->text_mean);
    free(m->text_inv_std);
    free(m->H2);
    free(m->Q);
    free(m->C);
    free(m);
}

const GraphModelShape *graph_model_shape(const GraphModel *m) { return &m->s; }
size_t graph_model_n_params(const GraphModel *m) { return m->at.total; }
float *graph_model_params(GraphModel *m) { return m->params; }

int graph_model_set_adjacency(GraphModel *m, const double *counts, BraidError *err) {
    int P = m->P;
    for (int i = 0; i < P; i++) {
        double sum = 0;
        for (int j = 0; j < P; j++) {
            double c = counts[(size_t)i * P + j];
            if (!(c >= 0) || !isfinite(c)) return braid_error_set(err, "graph model: transition count (%d, %d) is %g", i, j, c);
            sum += c;
        }
        for (int j = 0; j < P; j++) m->adj[(size_t)i * P + j] = sum > 0 ? (float)(counts[(size_t)i * P + j] / sum) : 0.0f;
    }
    graph_model_freeze(m);
    return 0;
}

int graph_model_set_text_norm(GraphModel *m, const float *mean, const float *std, BraidError *err) {
    for (int i = 0; i < m->s.text_dim; i++) {
        if (!isfinite(mean[i]) || !isfinite(std[i]) || std[i] < 0)
            return braid_error_set(err, "graph model: hidden-state dimension %d has mean %g, std %g", i, mean[i], std[i]);
        m->text_mean[i] = mean[i];
        m->text_inv_std[i] = std[i] < 1e-6f ? 1.0f : 1.0f / std[i];
    }
    return 0;
}

/* ---------------------------------------------------------------- the graph encoder */

/* Activations of the two GraphSAGE layers over all P rows. */
typedef struct {
    float *cat0, *Z1, *H1, *cat1, *Z2, *H2; /* (P, 2d), (P, d), (P, d), (P, 2d), (P, d), (P, d) */
} GraphActs;

/* out (P, d) = A x (P, d) */
static void adj_mul(const GraphModel *m, const float *x, float *out) {
    int P = m->P, d = m->s.dim;
    memset(out, 0, (size_t)P * d * sizeof *out);
    for (int i = 0; i < P; i++)
        for (int j = 0; j < P; j++) {
            float a = m->adj[(size_t)i * P + j];
            if (a == 0.0f) continue;
            for (int c = 0; c < d; c++) out[(size_t)i * d + c] += a * x[(size_t)j * d + c];
        }
}

/* out (P, d) += A^T x (P, d), x read as the second half of rows of width 2d */
static void adj_t_mul_add(const GraphModel *m, const float *x, int stride, float *out) {
    int P = m->P, d = m->s.dim;
    for (int i = 0; i < P; i++)
        for (int j = 0; j < P; j++) {
            float a = m->adj[(size_t)i * P + j];
            if (a == 0.0f) continue;
            for (int c = 0; c < d; c++) out[(size_t)j * d + c] += a * x[(size_t)i * stride + c];
        }
}

/* One layer: cat = [h | A h], Z = cat W^T + b, out = ReLU(Z). tmp is (P, d) scratch. */
static void sage_layer(const GraphModel *m, const float *h, const float *W, const float *b, float *cat, float *Z, float *out, float *tmp) {
    int P = m->P, d = m->s.dim;
    adj_mul(m, h, tmp);
    for (int i = 0; i < P; i++) {
        memcpy(cat + (size_t)i * 2 * d, h + (size_t)i * d, (size_t)d * sizeof *h);
        memcpy(cat + (size_t)i * 2 * d + d, tmp + (size_t)i * d, (size_t)d * sizeof *h);
        matvec(Z + (size_t)i * d, W, b, cat + (size_t)i * 2 * d, d, 2 * d);
    }
    memcpy(out, Z, (size_t)P * d * sizeof *out);
    relu(out, P * d);
}

static void graph_forward(const GraphModel *m, GraphActs *a, float *tmp) {
    const float *p = m->params;
    sage_layer(m, p + m->at.E, p + m->at.W1, p + m->at.b1, a->cat0, a->Z1, a->H1, tmp);
    sage_layer(m, a->H1, p + m->at.W2, p + m->at.b2, a->cat1, a->Z2, a->H2, tmp);
}

/* Backward of one layer: dout (P, d) in, accumulates dW, db, and writes dh (P, d). dcat is (P, 2d). */
static void sage_layer_back(const GraphModel *m, const float *W, const float *cat, const float *Z, float *dout, float *dW, float *db,
                            float *dh, float *dcat) {
    int P = m->P, d = m->s.dim;
    for (size_t i = 0; i < (size_t)P * d; i++)
        if (Z[i] <= 0.0f) dout[i] = 0.0f;
    memset(dcat, 0, (size_t)P * 2 * d * sizeof *dcat);
    for (int i = 0; i < P; i++) {
        const float *dz = dout + (size_t)i * d;
        outer_add(dW, dz, cat + (size_t)i * 2 * d, d, 2 * d);
        for (int c = 0; c < d; c++) db[c] += dz[c];
        matvec_t_add(dcat + (size_t)i * 2 * d, W, dz, d, 2 * d);
    }
    for (int i = 0; i < P; i++) memcpy(dh + (size_t)i * d, dcat + (size_t)i * 2 * d, (size_t)d * sizeof *dh);
    adj_t_mul_add(m, dcat + d, 2 * d, dh);
}

void graph_model_freeze(GraphModel *m) {
    int P = m->P, d = m->s.dim, H = m->s.mlp;
    size_t pd = (size_t)P * d;
    float *buf = malloc((pd * 2 * 2 + pd * 4 + pd) * sizeof *buf);
    if (!buf) return; /* keeps the previous tables; create and decode check this path at start-up */
    GraphActs a = {buf, buf + pd * 2, buf + pd * 3, buf + pd * 4, buf + pd * 6, buf + pd * 7};
    graph_forward(m, &a, buf + pd * 8);
    memcpy(m->H2, a.H2, pd * sizeof *m->H2);
    const float *p = m->params;
    for (int v = 0; v < P; v++) {
        const float *h = m->H2 + (size_t)v * d;
        matvec(m->Q + (size_t)v * d, p + m->at.Wq, NULL, h, d, d);
        float *c = m->C + (size_t)v * H;
        for (int o = 0; o < H; o++) {
            const float *w = p + m->at.Wm1 + (size_t)o * m->Z;
            float acc = p[m->at.bm1 + o];
            for (int i = 0; i < d; i++) acc += w[i] * h[i];
            c[o] = acc;
        }
    }
    free(buf);
}

/* ---------------------------------------------------------------- one sample, forward and backward */

/* Everything one sample's forward computes that its backward needs. */
typedef struct {
    int cur, n_prev, last, len; /* last: the call before the current one (-1 = none); len: calls so far */
    int32_t prev[1024];   /* earlier calls attended over (max_history <= 1024) */
    float *q, *alpha, *h_path, *xn, *pre_t, *z, *pre_m, *mask, *mvec, *logits;
    int text_used;
} SampleActs;

static int clamp_agent(const GraphModel *m, int32_t v) { return v < 0 || v > m->s.n_agents ? m->s.n_agents : v; }

static size_t sample_floats(const GraphModel *m) {
    const GraphModelShape *s = &m->s;
    return (size_t)s->dim * 2 + s->max_history + (size_t)s->text_dim + s->text_out + m->Z + (size_t)s->mlp * 3 + m->KO;
}

static void sample_bind(const GraphModel *m, SampleActs *a, float *buf) {
    const GraphModelShape *s = &m->s;
    a->q = buf, buf += s->dim;
    a->alpha = buf, buf += s->max_history;
    a->h_path = buf, buf += s->dim;
    a->xn = buf, buf += s->text_dim;
    a->pre_t = buf, buf += s->text_out;
    a->z = buf, buf += m->Z;
    a->pre_m = buf, buf += s->mlp;
    a->mask = buf, buf += s->mlp;
    a->mvec = buf, buf += s->mlp;
    a->logits = buf;
}

/* The history's current call and the earlier calls attended over. */
static void sample_history(const GraphModel *m, SampleActs *a, const int32_t *history, int n) {
    a->cur = clamp_agent(m, history[n - 1]);
    a->last = n >= 2 ? clamp_agent(m, history[n - 2]) : -1;
    a->len = n;
    int first = n - 1 - m->s.max_history;
    if (first < 0) first = 0;
    a->n_prev = 0;
    for (int i = first; i < n - 1; i++) a->prev[a->n_prev++] = clamp_agent(m, history[i]);
}

/* Forward of one sample given H2 (and Q = Wq H2 rows when q_table != NULL, for inference). Dropout
 * on m when rng != NULL. Leaves logits in a->logits. */
static void sample_forward(const GraphModel *m, const float *H2, const float *q_table, SampleActs *a, const float *text, float dropout,
                           uint64_t *rng) {
    const GraphModelShape *s = &m->s;
    const float *p = m->params;
    int d = s->dim;
    const float *h_cur = H2 + (size_t)a->cur * d;
    if (q_table) memcpy(a->q, q_table + (size_t)a->cur * d, (size_t)d * sizeof *a->q);
    else matvec(a->q, p + m->at.Wq, NULL, h_cur, d, d);
    memset(a->h_path, 0, (size_t)d * sizeof *a->h_path);
    if (a->n_prev > 0) {
        float scale = 1.0f / sqrtf((float)d);
        for (int i = 0; i < a->n_prev; i++) {
            const float *k = H2 + (size_t)a->prev[i] * d;
            float acc = 0;
            for (int c = 0; c < d; c++) acc += a->q[c] * k[c];
            a->alpha[i] = acc * scale;
        }
        softmax(a->alpha, a->n_prev);
        for (int i = 0; i < a->n_prev; i++) {
            const float *k = H2 + (size_t)a->prev[i] * d;
            for (int c = 0; c < d; c++) a->h_path[c] += a->alpha[i] * k[c];
        }
    }
    memset(a->z, 0, (size_t)m->Z * sizeof *a->z);
    memcpy(a->z, h_cur, (size_t)d * sizeof *a->z);
    if (a->last >= 0) memcpy(a->z + z_prev(m), H2 + (size_t)a->last * d, (size_t)d * sizeof *a->z);
    memcpy(a->z + z_path(m), a->h_path, (size_t)d * sizeof *a->z);
    a->z[z_len(m) + length_bucket(a->len)] = 1.0f;
    a->text_used = text != NULL && s->text_dim > 0;
    if (s->text_dim) {
        float *h_txt = a->z + z_txt(m);
        if (a->text_used) {
            for (int i = 0; i < s->text_dim; i++) a->xn[i] = (text[i] - m->text_mean[i]) * m->text_inv_std[i];
            matvec(a->pre_t, p + m->at.Wt, p + m->at.bt, a->xn, s->text_out, s->text_dim);
            memcpy(h_txt, a->pre_t, (size_t)s->text_out * sizeof *h_txt);
            relu(h_txt, s->text_out);
        } else
            memset(h_txt, 0, (size_t)s->text_out * sizeof *h_txt);
    }
    matvec(a->pre_m, p + m->at.Wm1, p + m->at.bm1, a->z, s->mlp, m->Z);
    for (int o = 0; o < s->mlp; o++) {
        float keep = 1.0f;
        if (rng && dropout > 0) keep = rng_uniform(rng) < dropout ? 0.0f : 1.0f / (1.0f - dropout);
        a->mask[o] = keep;
        a->mvec[o] = (a->pre_m[o] > 0 ? a->pre_m[o] : 0.0f) * keep;
    }
    matvec(a->logits, p + m->at.Wm2, p + m->at.bm2, a->mvec, m->KO, s->mlp);
}

/* Turns logits into per-step probabilities in place and returns the summed cross-entropy of the
 * scored steps; with dlogits != NULL writes (p - onehot) * scale for scored rows, 0 elsewhere. */
static double sample_loss(const GraphModel *m, float *logits, const int32_t *labels, float scale, float *dlogits, int *scored) {
    int P = m->P;
    double loss = 0;
    for (int s = 0; s < m->s.k; s++) {
        float *row = logits + (size_t)s * P;
        double lse_minus = 0;
        float label_logit = labels[s] >= 0 && labels[s] < P ? row[labels[s]] : 0.0f;
        double lse = softmax(row, P);
        int y = labels[s];
        if (y >= 0 && y < P) {
            lse_minus = lse - label_logit;
            loss += lse_minus;
            (*scored)++;
        }
        if (!dlogits) continue;
        float *g = dlogits + (size_t)s * P;
        for (int i = 0; i < P; i++) g[i] = (y >= 0 && y < P) ? (row[i] - (i == y ? 1.0f : 0.0f)) * scale : 0.0f;
    }
    return loss;
}

/* Backward of one sample: gradients into grad (flat, like params) and dH2 (P, d). dl is the
 * gradient of the logits; scratch holds dm, dz, dq, dh_cur, dh_path, dpre_t. */
static void sample_backward(const GraphModel *m, const float *H2, const SampleActs *a, const float *dl, float *grad, float *dH2,
                            float *scratch) {
    const GraphModelShape *s = &m->s;
    const float *p = m->params;
    int d = s->dim, H = s->mlp;
    float *dm = scratch, *dz = dm + H, *dq = dz + m->Z, *dh_cur = dq + d, *dalpha = dh_cur + d;
    outer_add(grad + m->at.Wm2, dl, a->mvec, m->KO, H);
    for (int i = 0; i < m->KO; i++) grad[m->at.bm2 + i] += dl[i];
    memset(dm, 0, (size_t)H * sizeof *dm);
    matvec_t_add(dm, p + m->at.Wm2, dl, m->KO, H);
    for (int o = 0; o < H; o++) dm[o] = a->pre_m[o] > 0 ? dm[o] * a->mask[o] : 0.0f;
    outer_add(grad + m->at.Wm1, dm, a->z, H, m->Z);
    for (int o = 0; o < H; o++) grad[m->at.bm1 + o] += dm[o];
    memset(dz, 0, (size_t)m->Z * sizeof *dz);
    matvec_t_add(dz, p + m->at.Wm1, dm, H, m->Z);
    if (a->text_used) {
        float *dpre = dz + z_txt(m); /* reused in place: dh_txt -> dpre_t */
        for (int o = 0; o < s->text_out; o++) dpre[o] = a->pre_t[o] > 0 ? dpre[o] : 0.0f;
        outer_add(grad + m->at.Wt, dpre, a->xn, s->text_out, s->text_dim);
        for (int o = 0; o < s->text_out; o++) grad[m->at.bt + o] += dpre[o];
    }
    memcpy(dh_cur, dz, (size_t)d * sizeof *dh_cur);
    const float *dh_path = dz + z_path(m);
    if (a->last >= 0) {
        float *dl = dH2 + (size_t)a->last * d;
        for (int c = 0; c < d; c++) dl[c] += dz[z_prev(m) + c];
    }
    memset(dq, 0, (size_t)d * sizeof *dq);
    if (a->n_prev > 0) {
        float scale = 1.0f / sqrtf((float)d), dot = 0;
        for (int i = 0; i < a->n_prev; i++) {
            const float *k = H2 + (size_t)a->prev[i] * d;
            float g = 0;
            for (int c = 0; c < d; c++) g += dh_path[c] * k[c];
            dalpha[i] = g;
            dot += a->alpha[i] * g;
        }
        for (int i = 0; i < a->n_prev; i++) {
            const float *k = H2 + (size_t)a->prev[i] * d;
            float *dk = dH2 + (size_t)a->prev[i] * d;
            float ds = a->alpha[i] * (dalpha[i] - dot) * scale;
            for (int c = 0; c < d; c++) {
                dk[c] += a->alpha[i] * dh_path[c] + ds * a->q[c];
                dq[c] += ds * k[c];
            }
        }
    }
    outer_add(grad + m->at.Wq, dq, H2 + (size_t)a->cur * d, d, d);
    matvec_t_add(dh_cur, p + m->at.Wq, dq, d, d);
    float *dc = dH2 + (size_t)a->cur * d;
    for (int c = 0; c < d; c++) dc[c] += dh_cur[c];
}

/* ---------------------------------------------------------------- gradient of a set of samples */

typedef struct {
    float *graph;  /* GraphActs storage + tmp */
    GraphActs acts;
    float *tmp, *dH2, *dcat, *dh;
    float *sample; /* SampleActs storage */
    float *dl, *back;
} Work;

static void work_free(Work *w) {
    free(w->graph);
    free(w->sample);
    *w = (Work){0};
}

static int work_init(const GraphModel *m, Work *w, BraidError *err) {
    size_t pd = (size_t)m->P * m->s.dim;
    *w = (Work){0};
    w->graph = malloc(pd * 13 * sizeof *w->graph);
    size_t sf = sample_floats(m);
    size_t back = (size_t)m->s.mlp + m->Z + 2 * (size_t)m->s.dim + m->s.max_history;
    w->sample = malloc((sf + m->KO + back) * sizeof *w->sample);
    if (!w->graph || !w->sample) {
        work_free(w);
        return braid_error_set(err, "graph model: out of memory for training buffers");
    }
    float *g = w->graph;
    w->acts = (GraphActs){g, g + pd * 2, g + pd * 3, g + pd * 4, g + pd * 6, g + pd * 7};
    w->tmp = g + pd * 8;
    w->dH2 = g + pd * 9;
    w->dh = g + pd * 10;
    w->dcat = g + pd * 11; /* 2 pd */
    w->dl = w->sample + sf;
    w->back = w->dl + m->KO;
    return 0;
}

/* Gradient of the summed loss over samples idx[0..n) scaled by `scale`, into grad (zeroed by the
 * caller). Returns the summed loss; *scored counts the scored steps. */
static double batch_gradient(const GraphModel *m, Work *w, const GraphSample *samples, const int *idx, int n, float scale,
                             const GraphTrainConfig *cfg, uint64_t *rng, float *grad, int *scored) {
    size_t pd = (size_t)m->P * m->s.dim;
    graph_forward(m, &w->acts, w->tmp);
    memset(w->dH2, 0, pd * sizeof *w->dH2);
    double loss = 0;
    SampleActs a;
    sample_bind(m, &a, w->sample);
    for (int b = 0; b < n; b++) {
        const GraphSample *x = &samples[idx ? idx[b] : b];
        if (x->n < 1) continue;
        sample_history(m, &a, x->history, x->n);
        const float *text = x->text;
        if (text && rng && cfg->text_dropout > 0 && rng_uniform(rng) < cfg->text_dropout) text = NULL;
        sample_forward(m, w->acts.H2, NULL, &a, text, rng ? cfg->dropout : 0.0f, rng);
        loss += sample_loss(m, a.logits, x->labels, scale, w->dl, scored);
        sample_backward(m, w->acts.H2, &a, w->dl, grad, w->dH2, w->back);
    }
    const float *p = m->params;
    sage_layer_back(m, p + m->at.W2, w->acts.cat1, w->acts.Z2, w->dH2, grad + m->at.W2, grad + m->at.b2, w->dh, w->dcat);
    /* dh now holds dH1; dH2 is free again and takes dE. */
    sage_layer_back(m, p + m->at.W1, w->acts.cat0, w->acts.Z1, w->dh, grad + m->at.W1, grad + m->at.b1, w->dH2, w->dcat);
    for (size_t i = 0; i < pd; i++) grad[m->at.E + i] += w->dH2[i];
    return loss;
}

static int count_scored(const GraphModel *m, const GraphSample *samples, const int *idx, int n) {
    int c = 0;
    for (int b = 0; b < n; b++) {
        const GraphSample *x = &samples[idx ? idx[b] : b];
        if (x->n < 1) continue;
        for (int s = 0; s < m->s.k; s++) c += x->labels[s] >= 0 && x->labels[s] <= m->s.n_agents;
    }
    return c;
}

int graph_model_gradient(GraphModel *m, const GraphSample *samples, int n, float *grad, double *loss, BraidError *err) {
    Work w;
    if (work_init(m, &w, err)) return -1;
    int total = count_scored(m, samples, NULL, n), scored = 0;
    memset(grad, 0, m->at.total * sizeof *grad);
    GraphTrainConfig none = {0};
    double l = batch_gradient(m, &w, samples, NULL, n, total ? 1.0f / (float)total : 0.0f, &none, NULL, grad, &scored);
    *loss = total ? l / total : 0;
    work_free(&w);
    return 0;
}

double graph_model_loss(GraphModel *m, const GraphSample *samples, int n) {
    float *scratch = malloc(graph_model_scratch_floats(m) * sizeof *scratch);
    float *cond = malloc((size_t)m->KO * sizeof *cond);
    double loss = 0;
    int scored = 0;
    for (int i = 0; scratch && cond && i < n; i++) {
        if (graph_model_predict(m, samples[i].history, samples[i].n, samples[i].text, cond, scratch)) continue;
        for (int s = 0; s < m->s.k; s++) {
            int y = samples[i].labels[s];
            if (y < 0 || y > m->s.n_agents) continue;
            float pr = cond[(size_t)s * m->P + y];
            loss += -log(pr > 1e-30f ? pr : 1e-30f);
            scored++;
        }
    }
    free(scratch);
    free(cond);
    return scored ? loss / scored : 0;
}

/* ---------------------------------------------------------------- training */

/* Which parameters get weight decay: weights and embeddings, not biases. */
static int decayed(const GraphModel *m, size_t i) {
    const Layout *L = &m->at;
    return !((i >= L->b1 && i < L->W2) || (i >= L->b2 && i < L->Wq) || (i >= L->bt && i < L->Wm1) || (i >= L->bm1 && i < L->Wm2) ||
             i >= L->bm2);
}

static void shuffle(int *idx, int n, uint64_t *rng) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(rng_next(rng) % (uint64_t)(i + 1));
        int t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
}

int graph_model_train(GraphModel *m, const GraphSample *samples, int n, GraphTrainConfig *cfg_in, BraidError *err) {
    GraphTrainConfig cfg = *cfg_in;
    if (cfg.epochs <= 0) cfg.epochs = 40;
    if (cfg.batch <= 0) cfg.batch = 64;
    if (!(cfg.lr > 0)) cfg.lr = 3e-3f;
    if (cfg.weight_decay < 0) cfg.weight_decay = 0;
    if (n <= 0) return braid_error_set(err, "graph model: no training samples");
    size_t np = m->at.total;
    float *grad = malloc(np * sizeof *grad), *m1 = calloc(np, sizeof *m1), *m2 = calloc(np, sizeof *m2);
    float *best = cfg.n_valid > 0 ? malloc(np * sizeof *best) : NULL;
    double best_loss = INFINITY;
    int *idx = malloc((size_t)n * sizeof *idx);
    Work w = {0};
    int rc = 0;
    cfg_in->best_epoch = cfg.epochs;
    if (!grad || !m1 || !m2 || !idx || (cfg.n_valid > 0 && !best))
        rc = braid_error_set(err, "graph model: out of memory for %zu parameters", np);
    else rc = work_init(m, &w, err);
    uint64_t rng = cfg.seed ^ 0x7a11ed5eedull;
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    long step = 0;
    for (int i = 0; !rc && i < n; i++) idx[i] = i;
    for (int e = 0; !rc && e < cfg.epochs; e++) {
        shuffle(idx, n, &rng);
        double epoch_loss = 0;
        int epoch_scored = 0;
        for (int at = 0; at < n; at += cfg.batch) {
            int nb = n - at < cfg.batch ? n - at : cfg.batch;
            int total = count_scored(m, samples, idx + at, nb), scored = 0;
            if (!total) continue;
            memset(grad, 0, np * sizeof *grad);
            epoch_loss += batch_gradient(m, &w, samples, idx + at, nb, 1.0f / (float)total, &cfg, &rng, grad, &scored);
            epoch_scored += scored;
            step++;
            float c1 = 1.0f - powf(b1, (float)step), c2 = 1.0f - powf(b2, (float)step);
            for (size_t i = 0; i < np; i++) {
                float g = grad[i] + (decayed(m, i) ? cfg.weight_decay * m->params[i] : 0.0f);
                m1[i] = b1 * m1[i] + (1 - b1) * g;
                m2[i] = b2 * m2[i] + (1 - b2) * g * g;
                m->params[i] -= cfg.lr * (m1[i] / c1) / (sqrtf(m2[i] / c2) + eps);
            }
        }
        double valid_loss = NAN;
        if (cfg.n_valid > 0) {
            graph_model_freeze(m);
            valid_loss = graph_model_loss(m, cfg.valid, cfg.n_valid);
            if (valid_loss < best_loss) {
                best_loss = valid_loss;
                memcpy(best, m->params, np * sizeof *best);
                cfg_in->best_epoch = e + 1;
            }
        }
        if (cfg.progress) cfg.progress(cfg.progress_ctx, e + 1, cfg.epochs, epoch_scored ? epoch_loss / epoch_scored : 0, valid_loss);
    }
    if (!rc && best && best_loss < INFINITY) memcpy(m->params, best, np * sizeof *best);
    free(best);
    work_free(&w);
    free(grad);
    free(m1);
    free(m2);
    free(idx);
    graph_model_freeze(m);
    return rc;
}

/* ---------------------------------------------------------------- inference */

size_t graph_model_scratch_floats(const GraphModel *m) { return sample_floats(m); }

int graph_model_predict(const GraphModel *m, const int32_t *history, int n, const float *text, float *cond, float *scratch) {
    if (n < 1 || !history) return -1;
    const GraphModelShape *s = &m->s;
    const float *p = m->params;
    int d = s->dim, H = s->mlp;
    SampleActs a;
    sample_bind(m, &a, scratch);
    sample_history(m, &a, history, n);
    /* The frozen tables replace the h_cur part of the head (C) and the query (Q). */
    const float *h_cur = m->H2 + (size_t)a.cur * d;
    memcpy(a.q, m->Q + (size_t)a.cur * d, (size_t)d * sizeof *a.q);
    memset(a.h_path, 0, (size_t)d * sizeof *a.h_path);
    if (a.n_prev > 0) {
        float scale = 1.0f / sqrtf((float)d);
        for (int i = 0; i < a.n_prev; i++) {
            const float *k = m->H2 + (size_t)a.prev[i] * d;
            float acc = 0;
            for (int c = 0; c < d; c++) acc += a.q[c] * k[c];
            a.alpha[i] = acc * scale;
        }
        softmax(a.alpha, a.n_prev);
        for (int i = 0; i < a.n_prev; i++) {
            const float *k = m->H2 + (size_t)a.prev[i] * d;
            for (int c = 0; c < d; c++) a.h_path[c] += a.alpha[i] * k[c];
        }
    }
    (void)h_cur;
    const float *h_prev = a.last >= 0 ? m->H2 + (size_t)a.last * d : NULL;
    int txt = text && s->text_dim > 0, bucket = z_len(m) + length_bucket(a.len);
    float *h_txt = a.z; /* reuse z as h_txt storage */
    if (txt) {
        for (int i = 0; i < s->text_dim; i++) a.xn[i] = (text[i] - m->text_mean[i]) * m->text_inv_std[i];
        matvec(h_txt, p + m->at.Wt, p + m->at.bt, a.xn, s->text_out, s->text_dim);
        relu(h_txt, s->text_out);
    }
    for (int o = 0; o < H; o++) {
        const float *w = p + m->at.Wm1 + (size_t)o * m->Z;
        float acc = m->C[(size_t)a.cur * H + o] + dot(w + z_path(m), a.h_path, d) + w[bucket];
        if (h_prev) acc += dot(w + z_prev(m), h_prev, d);
        if (txt) acc += dot(w + z_txt(m), h_txt, s->text_out);
        a.mvec[o] = acc > 0 ? acc : 0.0f;
    }
    matvec(cond, p + m->at.Wm2, p + m->at.bm2, a.mvec, m->KO, H);
    for (int st = 0; st < s->k; st++) softmax(cond + (size_t)st * m->P, m->P);
    return 0;
}

/* ---------------------------------------------------------------- encoding */

#define BLOB_MAGIC "GRPH"
#define BLOB_VERSION 2u

static void put32(uint8_t **w, uint32_t v) {
    for (int i = 0; i < 4; i++) *(*w)++ = (uint8_t)(v >> (8 * i));
}

static void putf(uint8_t **w, float f) {
    uint32_t v;
    memcpy(&v, &f, sizeof v);
    put32(w, v);
}

static size_t blob_len(const GraphModel *m) {
    size_t P = (size_t)m->P;
    return 4 + 4 * 8 + 4 * (P * P + 2 * (size_t)m->s.text_dim + m->at.total);
}

int graph_model_encode(const GraphModel *m, uint8_t **blob, size_t *len, BraidError *err) {
    size_t n = blob_len(m);
    uint8_t *b = malloc(n), *w = b;
    if (!b) return braid_error_set(err, "graph model: out of memory encoding %zu bytes", n);
    memcpy(w, BLOB_MAGIC, 4);
    w += 4;
    const GraphModelShape *s = &m->s;
    uint32_t hdr[8] = {BLOB_VERSION, (uint32_t)s->n_agents, (uint32_t)s->dim, (uint32_t)s->text_dim, (uint32_t)s->text_out,
                       (uint32_t)s->mlp, (uint32_t)s->k, (uint32_t)s->max_history};
    for (int i = 0; i < 8; i++) put32(&w, hdr[i]);
    for (size_t i = 0; i < (size_t)m->P * m->P; i++) putf(&w, m->adj[i]);
    for (int i = 0; i < s->text_dim; i++) putf(&w, m->text_mean[i]);
    for (int i = 0; i < s->text_dim; i++) putf(&w, m->text_inv_std[i]);
    for (size_t i = 0; i < m->at.total; i++) putf(&w, m->params[i]);
    *blob = b;
    *len = n;
    return 0;
}

static uint32_t get32(const uint8_t **r) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)(*r)[i] << (8 * i);
    *r += 4;
    return v;
}

static int getf(const uint8_t **r, float *f) {
    uint32_t v = get32(r);
    memcpy(f, &v, sizeof *f);
    return isfinite(*f) ? 0 : -1;
}

int graph_model_decode(const uint8_t *blob, size_t len, GraphModel **out, BraidError *err) {
    *out = NULL;
    if (len < 36 || memcmp(blob, BLOB_MAGIC, 4) != 0) return braid_error_set(err, "graph model: not a graph model section");
    const uint8_t *r = blob + 4;
    uint32_t hdr[8];
    for (int i = 0; i < 8; i++) hdr[i] = get32(&r);
    if (hdr[0] != BLOB_VERSION) return braid_error_set(err, "graph model: section version %u (this build reads %u)", hdr[0], BLOB_VERSION);
    for (int i = 1; i < 8; i++)
        if (hdr[i] > 1u << 20) return braid_error_set(err, "graph model: shape field %d is %u, out of range", i, hdr[i]);
    GraphModelShape s = {.n_agents = (int)hdr[1], .dim = (int)hdr[2], .text_dim = (int)hdr[3], .text_out = (int)hdr[4],
                         .mlp = (int)hdr[5], .k = (int)hdr[6], .max_history = (int)hdr[7]};
    if (check_shape(&s, err)) return -1;
    GraphModel *m;
    if (graph_model_create(&m, &s, 0, err)) return -1;
    if (len != blob_len(m)) {
        size_t want = blob_len(m);
        graph_model_free(m);
        return braid_error_set(err, "graph model: section is %zu bytes, its shape needs %zu", len, want);
    }
    int bad = 0;
    for (size_t i = 0; i < (size_t)m->P * m->P; i++) bad |= getf(&r, &m->adj[i]) || m->adj[i] < 0;
    for (int i = 0; i < s.text_dim; i++) bad |= getf(&r, &m->text_mean[i]);
    for (int i = 0; i < s.text_dim; i++) bad |= getf(&r, &m->text_inv_std[i]) || m->text_inv_std[i] <= 0;
    for (size_t i = 0; i < m->at.total; i++) bad |= getf(&r, &m->params[i]);
    for (int i = 0; !bad && i < m->P; i++) {
        double sum = 0;
        for (int j = 0; j < m->P; j++) sum += m->adj[(size_t)i * m->P + j];
        bad |= sum != 0 && fabs(sum - 1.0) > 1e-3;
    }
    if (bad) {
        graph_model_free(m);
        return braid_error_set(err, "graph model: a weight, normalization or transition value is not finite or out of range");
    }
    graph_model_freeze(m);
    *out = m;
    return 0;
}
