#include "transport/ctrl_endpoint.h"

#include <stdlib.h>
#include <string.h>

#include "common/grow.h"
#include "transport/mpi_error.h"

void ctrl_init(CtrlEndpoint *e, MPI_Comm comm) {
    memset(e, 0, sizeof *e);
    e->comm = comm;
}

int ctrl_send(CtrlEndpoint *e, int dest, int type, WireBuf *buf, BraidError *err) {
    if (buf->failed) {
        wire_buf_free(buf);
        return braid_error_set(err, "ctrl: out of memory encoding a message");
    }
    if (buf->len > (size_t)INT32_MAX) {
        wire_buf_free(buf);
        return braid_error_set(err, "ctrl: message of %zu bytes is too large", buf->len);
    }
    if (braid_grow((void **)&e->pending, &e->cap_pending, e->n_pending + 1, sizeof *e->pending)) {
        wire_buf_free(buf);
        return braid_error_set(err, "ctrl: out of memory queueing a message");
    }
    PendingSend *p = &e->pending[e->n_pending];
    p->buf = *buf;
    p->dest = dest;
    memset(buf, 0, sizeof *buf);
    int rc = MPI_Isend(p->buf.data, (int)p->buf.len, MPI_BYTE, dest, type, e->comm, &p->request);
    if (rc != MPI_SUCCESS) {
        wire_buf_free(&p->buf);
        return mpi_check(rc, "send", err);
    }
    e->n_pending++;
    return 0;
}

int ctrl_progress(CtrlEndpoint *e, BraidError *err) {
    for (int i = 0; i < e->n_pending;) {
        int done = 0;
        if (mpi_check(MPI_Test(&e->pending[i].request, &done, MPI_STATUS_IGNORE), "send completion", err)) return -1;
        if (!done) {
            i++;
            continue;
        }
        wire_buf_free(&e->pending[i].buf);
        e->pending[i] = e->pending[--e->n_pending];
    }
    return 0;
}

static int poll_matching(CtrlEndpoint *e, int from, int tag, int *source, int *type, uint8_t **data, size_t *len, BraidError *err) {
    int flag = 0;
    MPI_Status st;
    if (mpi_check(MPI_Iprobe(from, tag, e->comm, &flag, &st), "probe", err)) return -1;
    if (!flag) return 0;
    int count = 0;
    if (mpi_check(MPI_Get_count(&st, MPI_BYTE, &count), "message size", err)) return -1;
    uint8_t *body = malloc((size_t)count + 1);
    if (!body) return braid_error_set(err, "ctrl: out of memory receiving %d bytes", count);
    if (mpi_check(MPI_Recv(body, count, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, e->comm, MPI_STATUS_IGNORE), "receive", err)) {
        free(body);
        return -1;
    }
    *source = st.MPI_SOURCE;
    *type = st.MPI_TAG;
    *data = body;
    *len = (size_t)count;
    return 1;
}

int ctrl_poll(CtrlEndpoint *e, int *source, int *type, uint8_t **data, size_t *len, BraidError *err) {
    return poll_matching(e, MPI_ANY_SOURCE, MPI_ANY_TAG, source, type, data, len, err);
}

int ctrl_poll_type(CtrlEndpoint *e, int from, int type, int *source, uint8_t **data, size_t *len, BraidError *err) {
    int got_type;
    return poll_matching(e, from, type, source, &got_type, data, len, err);
}

static void abandon(PendingSend *p) {
    MPI_Cancel(&p->request);
    MPI_Request_free(&p->request);
    wire_buf_free(&p->buf);
}

void ctrl_forget_dest(CtrlEndpoint *e, int dest) {
    for (int i = 0; i < e->n_pending;) {
        if (e->pending[i].dest != dest) {
            i++;
            continue;
        }
        abandon(&e->pending[i]);
        e->pending[i] = e->pending[--e->n_pending];
    }
}

int ctrl_flush(CtrlEndpoint *e, BraidError *err) {
    for (int i = 0; i < e->n_pending; i++) {
        if (mpi_check(MPI_Wait(&e->pending[i].request, MPI_STATUS_IGNORE), "send completion", err)) return -1;
        wire_buf_free(&e->pending[i].buf);
    }
    e->n_pending = 0;
    return 0;
}

void ctrl_free(CtrlEndpoint *e) {
    for (int i = 0; i < e->n_pending; i++) abandon(&e->pending[i]);
    free(e->pending);
    memset(e, 0, sizeof *e);
}
