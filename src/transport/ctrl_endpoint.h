/*
 * ctrl_endpoint.h — non-blocking send and receive of control messages over one communicator.
 *
 * Sends are MPI_Isend: the endpoint keeps each buffer until MPI says it is done, so neither side
 * ever blocks in a send (two ranks blocked sending large messages to each other would deadlock
 * once a message passes MPI's eager limit). Call ctrl_progress() regularly to retire sends, and
 * ctrl_flush() before MPI_Finalize (after ctrl_forget_dest for every peer known dead). Receives poll with MPI_Iprobe from any source, any tag; the
 * tag is the MsgType.
 * Owns the pending send buffers. One thread of control per endpoint (the rank's MPI thread).
 */
#ifndef BRAID_TRANSPORT_CTRL_ENDPOINT_H
#define BRAID_TRANSPORT_CTRL_ENDPOINT_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "transport/wire.h"

typedef struct {
    MPI_Request request;
    WireBuf buf;
    int dest;
} PendingSend;

typedef struct {
    MPI_Comm comm;
    PendingSend *pending;
    int n_pending, cap_pending;
} CtrlEndpoint;

void ctrl_init(CtrlEndpoint *e, MPI_Comm comm);
/* Sends buf's bytes as a message of `type` to `dest`; takes the buffer (it is reset either way). */
int ctrl_send(CtrlEndpoint *e, int dest, int type, WireBuf *buf, BraidError *err);
/* Retires completed sends. */
int ctrl_progress(CtrlEndpoint *e, BraidError *err);
/* Receives one waiting message if there is one: returns 1 and fills source, type and a malloc'd
 * body (caller frees); 0 when nothing is waiting; -1 on an MPI error. */
int ctrl_poll(CtrlEndpoint *e, int *source, int *type, uint8_t **data, size_t *len, BraidError *err);
/* As ctrl_poll, for a message of one type from `from` (MPI_ANY_SOURCE: any) only; every other
 * message stays queued, in order. *source is the sender. */
int ctrl_poll_type(CtrlEndpoint *e, int from, int type, int *source, uint8_t **data, size_t *len, BraidError *err);
/* Gives up the pending sends to dest (a dead peer: they would never complete, and waiting for
 * them would hang ctrl_flush): cancelled, freed, forgotten. */
void ctrl_forget_dest(CtrlEndpoint *e, int dest);
/* Waits for every pending send. */
int ctrl_flush(CtrlEndpoint *e, BraidError *err);
void ctrl_free(CtrlEndpoint *e);

#endif
