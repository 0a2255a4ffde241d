/*
 * instance_join.h — an instance that joins a running coordinator as its own MPI job
 * (`braid serve --join-slots K` on the coordinator, `braid serve --join-instance I` on the joiner).
 *
 * Why: a node lost from the coordinator's mpirun job cannot come back into it (Open MPI 4.1.4's
 * MPI_Comm_spawn hangs after a lost daemon), but a separate `mpirun` job on the returning node can
 * connect to the coordinator (MPI_Comm_connect / MPI_Comm_accept, the port published under a name
 * in `ompi-server`, both jobs started with `--ompi-server file:URI`). Measured limit of Open MPI
 * 4.1.4 (docs/ARCHITECTURE.md "Nodes and a lost node"): both jobs must have all their processes on
 * their own mpirun's node (no orted); otherwise the other side's daemon crashes in the connect.
 * Protocol: the joiner connects and sends its instance number (JOIN_TAG_HELLO, one int); the
 * coordinator answers with a verdict (JOIN_TAG_VERDICT, one int: 1 taken, 0 refused). A taken
 * joiner then runs exactly as a respawned leader (instance_restart.h): MSG_REJOIN, load, READY,
 * with the intercommunicator as its control plane. The coordinator then sends it MSG_COORD_ALIVE
 * every second, and the joined leader stops when that stops (--coordinator-timeout): its
 * coordinator's death reaches it no other way (no MPI error on the intercommunicator, no signal
 * from its own mpirun).
 * Threads: the acceptor runs MPI_Comm_accept in its own thread (the process must have
 * MPI_THREAD_MULTIPLE), so a connect that never completes cannot stop the coordinator's MPI loop;
 * join_acceptor_take and join_verdict run on the MPI thread. The accept thread cannot be stopped
 * once inside MPI_Comm_accept: a coordinator that accepts joins ends without MPI_Finalize.
 */
#ifndef BRAID_COORD_INSTANCE_JOIN_H
#define BRAID_COORD_INSTANCE_JOIN_H

#include <mpi.h>
#include <stdbool.h>

#include "common/error.h"

#define JOIN_TAG_HELLO 32001
#define JOIN_TAG_VERDICT 32002
#define JOIN_DEFAULT_SERVICE "braid-join"
/* A joiner's wait for the verdict when it is given no bound of its own (--coordinator-timeout 0):
 * the verdict is sent as soon as the coordinator's MPI thread takes the hello, so this is ample. */
#define JOIN_VERDICT_DEFAULT_S 10.0

typedef struct JoinAcceptor JoinAcceptor;

/* Opens a port, publishes it as `service` (the name service of mpirun's --ompi-server) and starts
 * the accept thread. NULL with err when MPI cannot (no MPI_THREAD_MULTIPLE, no name service). */
JoinAcceptor *join_acceptor_start(const char *service, BraidError *err);
/* A joiner that has connected and named its instance, if any (non-blocking): true with *instance
 * and *inter (errors return on it); the caller owns inter and must answer with join_verdict. */
bool join_acceptor_take(JoinAcceptor *j, int *instance, MPI_Comm *inter);
/* Tells the joiner whether it is taken. A refused joiner's intercommunicator is not freed (its
 * peer may be gone; a disconnect would wait for it). */
int join_verdict(MPI_Comm inter, bool taken, BraidError *err);
/* Unpublishes the name. The accept thread stays blocked in MPI (see above); memory is not freed. */
void join_acceptor_stop(JoinAcceptor *j);

/* Joiner side: looks `service` up (again for up to 30 s while the name is not there), connects, asks for `instance` and waits for the verdict, at
 * most timeout_s seconds (<= 0: JOIN_VERDICT_DEFAULT_S; a coordinator that died or stalled after
 * the connect never answers, and a joiner must not wait for it forever). 0 with *inter when taken;
 * -1 with err when refused, not answered or MPI failed. */
int join_connect(const char *service, int instance, double timeout_s, MPI_Comm *inter, BraidError *err);

#endif
