/*
 * http_front_door.h — the HTTP listener's accept loop: bounds connections that have not yet sent a
 * request line, and answers a malformed request line with a JSON error.
 *
 * Why: libmicrohttpd gives every accepted connection a thread and holds it until its timeout, and
 * answers a garbage request line with an HTML page or by closing the socket. Here one thread owns
 * the listening socket and polls the accepted connections until each has sent its request line
 * (peeked, not read); only then is the connection handed to libmicrohttpd (MHD_add_connection).
 * So a flood of connections that send half a request line and stop costs one descriptor each, is
 * bounded per client address (max_pending_per_client) and in total (max_pending), and is timed out
 * after line_timeout_s; when a bound is reached the *oldest* pending connection of that client
 * (or of all) is closed with a JSON 408, so a new connection that sends its request line at once
 * (a health check, a well-behaved client, even one from the flooding address) still gets in.
 * A request line that is not `METHOD SP TARGET SP HTTP/1.x` gets a JSON 400 (a version other than
 * 1.0/1.1: 505), one longer than FRONT_DOOR_MAX_LINE a JSON 414, and the connection is closed.
 * When the first FRONT_DOOR_PEEK_BYTES also hold the whole header block, its framing is checked
 * too (front_door_check_framing): libmicrohttpd 0.9.75 answers a malformed Content-Length with its
 * status line and headers sent twice (the client reads the second copy as the body), and waits
 * silently for its idle timeout on a Transfer-Encoding it does not know or on Content-Length
 * headers that disagree. Those get a JSON 400/413/501 here, and the connection is closed.
 * With TLS the bytes are encrypted: connections are handed over as soon as they are accepted.
 *
 * Owns the listening socket, its thread and the pending connections. front_door_stop closes
 * them all; handed-over connections belong to the hand_over callback.
 */
#ifndef BRAID_COORD_HTTP_FRONT_DOOR_H
#define BRAID_COORD_HTTP_FRONT_DOOR_H

#include <stdbool.h>
#include <sys/socket.h>

#include "common/error.h"

#define FRONT_DOOR_MAX_LINE 8192 /* request line bytes; more gets 414 */
#define FRONT_DOOR_PEEK_BYTES 16384 /* how much of a new connection's first bytes is looked at */
#define FRONT_DOOR_MAX_CONTENT_LENGTH (1LL << 62) /* a Content-Length above this is a 413 here */

typedef struct {
    const char *host;            /* IPv4 bind address */
    int port;
    bool inspect_request_line;   /* false with TLS: hand over at once */
    int max_pending_per_client;  /* connections per client address still before their request line */
    int max_pending;             /* all such connections */
    double line_timeout_s;       /* to send the whole request line */
    /* Takes over a connection whose request line is complete (and stays unread in the socket).
     * Called on the front door's thread; returns 0, or -1 when it could not (the fd is then closed
     * by the callee, as MHD_add_connection does). */
    int (*hand_over)(void *ctx, int fd, const struct sockaddr *addr, socklen_t addr_len);
    void *hand_over_ctx;
} FrontDoorConfig;

typedef struct FrontDoor FrontDoor;

/* Binds and listens (SO_REUSEADDR), then starts the thread. NULL with err set when the address is
 * not IPv4, the port cannot be bound, or out of memory. */
FrontDoor *front_door_start(const FrontDoorConfig *cfg, BraidError *err);
/* The port it listens on (the one the kernel chose when cfg->port was 0). */
int front_door_port(const FrontDoor *fd);
/* Stops accepting, closes every pending connection and the socket, joins the thread. NULL is fine. */
void front_door_stop(FrontDoor *fd);

/* The framing of a header block (exposed for the unit test): head is what follows the request
 * line's LF, through the blank line that ends the block (or less: the check stops at len). Returns
 * 0 when it is sound, else the status to answer with *why (a static string) set: 400 for a header
 * line without a colon, a Content-Length that is not 1*DIGIT, Content-Length headers (or list
 * elements) that disagree, or Content-Length beside Transfer-Encoding (a smuggling shape, RFC 9112
 * 6.3); 413 for a Content-Length above FRONT_DOOR_MAX_CONTENT_LENGTH; 501 for a Transfer-Encoding
 * other than exactly one "chunked". */
int front_door_check_framing(const char *head, size_t len, const char **why);

/* What a request line is (exposed for the unit test): 0 valid, else the HTTP status to answer
 * (400 malformed, 505 unsupported version). line excludes the CR LF. */
int front_door_check_request_line(const char *line, size_t len);

#endif
