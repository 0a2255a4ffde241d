/* The HTTP accept loop; the contract is in http_front_door.h. */
#define _GNU_SOURCE /* accept4 */
#include "coord/http/http_front_door.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/timeutil.h"

/* One accepted connection that has not sent its whole request line yet. */
typedef struct {
    int fd;
    struct sockaddr_in addr;
    double deadline;
    double accepted; /* for "oldest first" */
} Pending;

struct FrontDoor {
    FrontDoorConfig cfg;
    int listen_fd;
    int wake[2];          /* front_door_stop writes here to end the poll */
    pthread_t thread;
    Pending *pending;     /* (max_pending) */
    int n_pending;
    struct pollfd *polls; /* (max_pending + 2) */
};

/* ---- the request line ---- */

static bool is_token_char(unsigned char c) {
    /* RFC 9110 tchar */
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c && strchr("!#$%&'*+-.^_`|~", c));
}

int front_door_check_request_line(const char *line, size_t len) {
    size_t i = 0;
    while (i < len && is_token_char((unsigned char)line[i])) i++;
    if (i == 0 || i == len || line[i] != ' ') return 400;
    size_t target = ++i;
    while (i < len && (unsigned char)line[i] > 0x20 && (unsigned char)line[i] != 0x7f) i++;
    if (i == target || i == len || line[i] != ' ') return 400;
    const char *version = line + i + 1;
    size_t vlen = len - i - 1;
    if (vlen != 8 || memcmp(version, "HTTP/", 5) != 0 || version[6] != '.' || version[5] < '0' || version[5] > '9' ||
        version[7] < '0' || version[7] > '9')
        return 400;
    return version[5] == '1' && (version[7] == '0' || version[7] == '1') ? 0 : 505;
}

/* ---- the header block's framing ---- */

static bool ows(char c) { return c == ' ' || c == '\t'; }

/* A header field value with its surrounding whitespace (and a CR before the LF) trimmed. */
static void trim(const char **v, size_t *n) {
    while (*n > 0 && (ows((*v)[0]))) ++*v, --*n;
    while (*n > 0 && (ows((*v)[*n - 1]) || (*v)[*n - 1] == '\r')) --*n;
}

/* One Content-Length value: 1*DIGIT, or a comma-separated list of them (RFC 9110 8.6). Each
 * element must equal *length (set by the first one seen, -1 until then). 0, else 400 or 413. */
static int content_length_value(const char *v, size_t n, long long *length, const char **why) {
    size_t i = 0;
    do {
        while (i < n && ows(v[i])) i++;
        size_t start = i;
        long long x = 0;
        for (; i < n && v[i] >= '0' && v[i] <= '9'; i++) {
            if (x > (FRONT_DOOR_MAX_CONTENT_LENGTH - (v[i] - '0')) / 10) {
                *why = "Content-Length is larger than any body this server accepts";
                return 413;
            }
            x = x * 10 + (v[i] - '0');
        }
        if (i == start) return *why = "Content-Length must be a decimal number of bytes", 400;
        while (i < n && ows(v[i])) i++;
        if (i < n && v[i] != ',') return *why = "Content-Length must be a decimal number of bytes", 400;
        if (*length >= 0 && x != *length) return *why = "the request has Content-Length headers that disagree", 400;
        *length = x;
    } while (i++ < n);
    return 0;
}

int front_door_check_framing(const char *head, size_t len, const char **why) {
    long long length = -1;
    int transfer_encodings = 0;
    for (size_t at = 0; at < len;) {
        const char *line = head + at, *lf = memchr(line, '\n', len - at);
        size_t n = lf ? (size_t)(lf - line) : len - at;
        at += n + 1;
        if (n > 0 && line[n - 1] == '\r') n--;
        if (n == 0) break;                  /* the blank line: the header block ends */
        if (ows(line[0])) continue;         /* obs-fold: libmicrohttpd's to judge */
        const char *colon = memchr(line, ':', n);
        if (!colon || colon == line) return *why = "malformed header line: expected NAME: VALUE", 400;
        size_t name_len = (size_t)(colon - line), vlen = n - name_len - 1;
        const char *v = colon + 1;
        trim(&v, &vlen);
        if (name_len == 14 && strncasecmp(line, "Content-Length", 14) == 0) {
            int status = content_length_value(v, vlen, &length, why);
            if (status) return status;
        } else if (name_len == 17 && strncasecmp(line, "Transfer-Encoding", 17) == 0) {
            if (++transfer_encodings > 1 || vlen != 7 || strncasecmp(v, "chunked", 7) != 0)
                return *why = "only Transfer-Encoding: chunked is supported (or send Content-Length)", 501;
        }
    }
    if (transfer_encodings && length >= 0)
        return *why = "a request carries Content-Length or Transfer-Encoding: chunked, not both", 400;
    return 0;
}

/* ---- answering and closing ---- */

/* Best effort: the socket is non-blocking and the answer small; a client that does not read it
 * loses it. The JSON is OpenAI's error shape. */
static void answer_and_close(int fd, int status, const char *reason, const char *message) {
    char body[512], head[256];
    int blen = snprintf(body, sizeof body,
                        "{\"error\":{\"message\":\"%s\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":null}}", message);
    int hlen = snprintf(head, sizeof head,
                        "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", status,
                        reason, blen);
    if (send(fd, head, (size_t)hlen, MSG_NOSIGNAL | MSG_DONTWAIT) == hlen) send(fd, body, (size_t)blen, MSG_NOSIGNAL | MSG_DONTWAIT);
    /* Read what the client sent, so close() sends FIN rather than a reset that could destroy the answer in flight. */
    char sink[4096];
    while (recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {
    }
    shutdown(fd, SHUT_WR);
    close(fd);
}

static void drop_pending(FrontDoor *d, int i) { d->pending[i] = d->pending[--d->n_pending]; }

/* Closes pending connection i with a 408 (it held a slot a newer connection needs, or ran out of time). */
static void time_out_pending(FrontDoor *d, int i, const char *why) {
    answer_and_close(d->pending[i].fd, 408, "Request Timeout", why);
    drop_pending(d, i);
}

/* The oldest pending connection, of one client address (addr) or of all (addr NULL); -1 if none. */
static int oldest_pending(const FrontDoor *d, const struct in_addr *addr, int *count) {
    int oldest = -1;
    *count = 0;
    for (int i = 0; i < d->n_pending; i++) {
        if (addr && d->pending[i].addr.sin_addr.s_addr != addr->s_addr) continue;
        ++*count;
        if (oldest < 0 || d->pending[i].accepted < d->pending[oldest].accepted) oldest = i;
    }
    return oldest;
}

/* ---- accepting ---- */

static void hand_over(FrontDoor *d, int fd, const struct sockaddr_in *addr) {
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    if (d->cfg.hand_over(d->cfg.hand_over_ctx, fd, (const struct sockaddr *)addr, sizeof *addr))
        LOG_WARN("http", "a connection could not be handed to the HTTP server (connection limit reached?): %s", strerror(errno));
}

/* Makes room for one more pending connection from addr: past a bound, the oldest goes. */
static void make_room(FrontDoor *d, const struct in_addr *addr) {
    int count, oldest = oldest_pending(d, addr, &count);
    if (count >= d->cfg.max_pending_per_client && oldest >= 0)
        time_out_pending(d, oldest, "too many connections from this client have not sent a request line");
    oldest = oldest_pending(d, NULL, &count);
    if (count >= d->cfg.max_pending && oldest >= 0)
        time_out_pending(d, oldest, "too many connections have not sent a request line");
}

static void accept_ready(FrontDoor *d) {
    for (;;) {
        struct sockaddr_in addr;
        socklen_t len = sizeof addr;
        int fd = accept4(d->listen_fd, (struct sockaddr *)&addr, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                LOG_WARN("http", "accept failed: %s", strerror(errno)); /* EMFILE and the like: retried on the next poll */
            return;
        }
        if (!d->cfg.inspect_request_line) {
            hand_over(d, fd, &addr);
            continue;
        }
        make_room(d, &addr.sin_addr);
        double now = braid_now_seconds();
        d->pending[d->n_pending++] = (Pending){.fd = fd, .addr = addr, .deadline = now + d->cfg.line_timeout_s, .accepted = now};
    }
}

/* The framing check of the header block that follows the request line, when the peek holds all of
 * it (up to its blank line); when it does not (a header block longer than the peek, or sent in
 * pieces) the connection goes to libmicrohttpd unchecked, as before. */
static int check_peeked_head(const char *head, size_t len, const char **why) {
    for (size_t i = 0; i < len; i++) {
        if (head[i] != '\n') continue;
        size_t start = i + 1; /* the next line: blank (LF or CR LF) ends the block */
        if (start < len && head[start] == '\n') return front_door_check_framing(head, start + 1, why);
        if (start + 1 < len && head[start] == '\r' && head[start + 1] == '\n') return front_door_check_framing(head, start + 2, why);
    }
    return 0; /* no blank line yet (or no headers at all): nothing to check here */
}

/* Looks at what pending connection i has sent so far. Returns true when it left the pending set. */
static bool inspect(FrontDoor *d, int i) {
    Pending *p = &d->pending[i];
    char buf[FRONT_DOOR_PEEK_BYTES];
    ssize_t n = recv(p->fd, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        close(p->fd); /* the client left */
        drop_pending(d, i);
        return true;
    }
    if (n < 0) return false;
    size_t line_room = FRONT_DOOR_MAX_LINE + 2;
    char *eol = memchr(buf, '\n', (size_t)n < line_room ? (size_t)n : line_room);
    if (!eol) {
        if ((size_t)n < line_room) return false; /* more is coming */
        answer_and_close(p->fd, 414, "URI Too Long", "the request line is longer than 8192 bytes");
        drop_pending(d, i);
        return true;
    }
    size_t len = (size_t)(eol - buf);
    if (len > 0 && buf[len - 1] == '\r') len--;
    int status = front_door_check_request_line(buf, len);
    const char *why = NULL;
    if (status == 0) status = check_peeked_head(eol + 1, (size_t)(buf + n - (eol + 1)), &why);
    if (status == 0) {
        Pending taken = *p;
        drop_pending(d, i);
        hand_over(d, taken.fd, &taken.addr);
    } else if (status == 505) {
        answer_and_close(p->fd, 505, "HTTP Version Not Supported", "only HTTP/1.0 and HTTP/1.1 are supported");
        drop_pending(d, i);
    } else if (why) {
        answer_and_close(p->fd, status, status == 413 ? "Content Too Large" : status == 501 ? "Not Implemented" : "Bad Request", why);
        drop_pending(d, i);
    } else {
        answer_and_close(p->fd, 400, "Bad Request", "malformed request line: expected METHOD SP TARGET SP HTTP/1.1");
        drop_pending(d, i);
    }
    return true;
}

/* ---- the loop ---- */

/* Milliseconds until the next pending deadline (-1: none). */
static int next_timeout_ms(const FrontDoor *d, double now) {
    double soonest = -1;
    for (int i = 0; i < d->n_pending; i++)
        if (soonest < 0 || d->pending[i].deadline < soonest) soonest = d->pending[i].deadline;
    if (soonest < 0) return -1;
    double ms = (soonest - now) * 1000.0;
    return ms < 0 ? 0 : ms > 60000 ? 60000 : (int)ms + 1;
}

static void *front_door_main(void *arg) {
    FrontDoor *d = arg;
    for (;;) {
        int n = d->n_pending;
        d->polls[0] = (struct pollfd){.fd = d->wake[0], .events = POLLIN};
        d->polls[1] = (struct pollfd){.fd = d->listen_fd, .events = POLLIN};
        for (int i = 0; i < n; i++) d->polls[2 + i] = (struct pollfd){.fd = d->pending[i].fd, .events = POLLIN};
        int rc = poll(d->polls, (nfds_t)(n + 2), next_timeout_ms(d, braid_now_seconds()));
        if (rc < 0 && errno != EINTR) {
            LOG_ERROR("http", "front door: poll failed: %s; no new connections are accepted", strerror(errno));
            break;
        }
        if (d->polls[0].revents) break; /* front_door_stop */
        /* Pending connections first (indices match polls until the set changes), newest to oldest so
         * that removing one (swap with the last) never skips an unvisited one. */
        for (int i = n - 1; i >= 0; i--)
            if (d->polls[2 + i].revents) inspect(d, i);
        double now = braid_now_seconds();
        for (int i = d->n_pending - 1; i >= 0; i--)
            if (d->pending[i].deadline <= now) time_out_pending(d, i, "the request line did not arrive in time");
        if (d->polls[1].revents & POLLIN) accept_ready(d);
    }
    return NULL;
}

static int listen_on(const FrontDoorConfig *cfg, BraidError *err) {
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)cfg->port)};
    if (inet_pton(AF_INET, cfg->host, &addr.sin_addr) != 1) return braid_error_set(err, "http: --host %s is not an IPv4 address", cfg->host);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd < 0) return braid_error_set(err, "http: cannot create a socket: %s", strerror(errno));
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) || bind(fd, (struct sockaddr *)&addr, sizeof addr) ||
        listen(fd, 1024)) {
        int e = errno;
        close(fd);
        return braid_error_set(err, "http: cannot listen on %s:%d: %s", cfg->host, cfg->port, strerror(e));
    }
    return fd;
}

FrontDoor *front_door_start(const FrontDoorConfig *cfg, BraidError *err) {
    FrontDoor *d = calloc(1, sizeof *d);
    if (!d) return braid_error_set(err, "http: out of memory"), NULL;
    d->cfg = *cfg;
    d->wake[0] = d->wake[1] = -1;
    d->pending = calloc((size_t)cfg->max_pending + 1, sizeof *d->pending);
    d->polls = calloc((size_t)cfg->max_pending + 3, sizeof *d->polls);
    if (!d->pending || !d->polls || pipe2(d->wake, O_CLOEXEC)) {
        braid_error_set(err, "http: out of memory or descriptors for the accept loop");
        d->listen_fd = -1;
        front_door_stop(d);
        return NULL;
    }
    if ((d->listen_fd = listen_on(cfg, err)) < 0) {
        front_door_stop(d);
        return NULL;
    }
    int rc = pthread_create(&d->thread, NULL, front_door_main, d);
    if (rc) {
        braid_error_set(err, "http: cannot start the accept thread: %s", strerror(rc));
        close(d->wake[1]); /* nothing to join */
        d->wake[1] = -1;
        front_door_stop(d);
        return NULL;
    }
    return d;
}

int front_door_port(const FrontDoor *d) {
    struct sockaddr_in addr;
    socklen_t len = sizeof addr;
    if (getsockname(d->listen_fd, (struct sockaddr *)&addr, &len)) return -1;
    return ntohs(addr.sin_port);
}

void front_door_stop(FrontDoor *d) {
    if (!d) return;
    if (d->wake[1] >= 0) {
        if (write(d->wake[1], "x", 1) != 1) LOG_WARN("http", "front door: cannot wake the accept thread: %s", strerror(errno));
        pthread_join(d->thread, NULL);
        close(d->wake[1]);
    }
    if (d->wake[0] >= 0) close(d->wake[0]);
    for (int i = 0; i < d->n_pending; i++) close(d->pending[i].fd);
    if (d->listen_fd >= 0) close(d->listen_fd);
    free(d->pending);
    free(d->polls);
    free(d);
}
