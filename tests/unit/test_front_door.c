/* The HTTP front door (issue 22, points 7 and 8) over real loopback sockets: request-line
 * validation; a complete request line is handed over with its bytes unread; a malformed one gets a
 * JSON 400; a header block with broken framing (Content-Length, Transfer-Encoding) gets a JSON
 * 400/413/501 rather than libmicrohttpd's doubled answer or silence; connections that never finish their request line are bounded per client (the oldest
 * closed with a 408, so a new well-behaved connection still gets in) and timed out. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "coord/http/http_front_door.h"

static void test_request_line(void **state) {
    (void)state;
    struct {
        const char *line;
        int status;
    } cases[] = {
        {"GET /health HTTP/1.1", 0},       {"POST /v1/chat/completions?x=1 HTTP/1.0", 0}, {"GARBAGE", 400},
        {"GET", 400},                      {"GET /health", 400},                          {"hello world foo bar", 400},
        {"GET  /health HTTP/1.1", 400},    {"GET /health HTTP/1.1 ", 400},                {"\x16\x03\x01 / HTTP/1.1", 400},
        {"GET /health HTTP/9.9", 505},     {"GET /health HTTP/2.0", 505},                 {"GET /health HTTX/1.1", 400},
        {"GET /a\x7f" "b HTTP/1.1", 400},  {"", 400},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (front_door_check_request_line(cases[i].line, strlen(cases[i].line)) != cases[i].status)
            fail_msg("'%s': expected %d", cases[i].line, cases[i].status);
}

/* The header block's framing (issue: hostile requests): what libmicrohttpd would answer with a
 * doubled status line and headers, or not at all until its idle timeout, is judged here. */
static void test_framing(void **state) {
    (void)state;
    struct {
        const char *head;
        int status;
    } cases[] = {
        {"Host: x\r\nContent-Length: 12\r\n\r\n", 0},
        {"Host: x\r\n\r\n", 0},
        {"\r\n", 0},
        {"Content-Length: 5\nX-A: b\n\n", 0},                   /* bare LF */
        {"content-length:  7 \r\ncontent-length: 7\r\n\r\n", 0}, /* repeated, equal */
        {"Content-Length: 7, 7\r\n\r\n", 0},
        {"Transfer-Encoding: chunked\r\n\r\n", 0},
        {"Transfer-Encoding: CHUNKED\r\n\r\n", 0},
        {"X-A: a\r\n b\r\n\r\n", 0},                          /* obs-fold: left to libmicrohttpd */
        {"Content-Length: 4611686018427387904\r\n\r\n", 0},      /* 2^62: not above the bound */
        {"Content-Length: -1\r\n\r\n", 400},
        {"Content-Length: abc\r\n\r\n", 400},
        {"Content-Length: \r\n\r\n", 400},
        {"Content-Length: 1e3\r\n\r\n", 400},
        {"Content-Length: +5\r\n\r\n", 400},
        {"Content-Length: 5\r\nContent-Length: 7\r\n\r\n", 400},
        {"Content-Length: 5, 7\r\n\r\n", 400},
        {"Content-Length: 5,\r\n\r\n", 400},
        {"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
        {"Host x\r\n\r\n", 400},
        {": x\r\n\r\n", 400},
        {"Content-Length: 4611686018427387905\r\n\r\n", 413},
        {"Content-Length: 1000000000000000000000000000000\r\n\r\n", 413},
        {"Content-Length: 18446744073709551616\r\n\r\n", 413},
        {"Transfer-Encoding: gzip\r\n\r\n", 501},
        {"Transfer-Encoding: gzip, chunked\r\n\r\n", 501},
        {"Transfer-Encoding: chunked, identity\r\n\r\n", 501},
        {"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 501},
        {"Transfer-Encoding: \r\n\r\n", 501},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *why = NULL;
        int got = front_door_check_framing(cases[i].head, strlen(cases[i].head), &why);
        if (got != cases[i].status) fail_msg("'%s': expected %d, got %d", cases[i].head, cases[i].status, got);
        if (got && (!why || !why[0] || strchr(why, '"'))) fail_msg("'%s': %d without a message fit for JSON", cases[i].head, got);
    }
    /* The check stops at len: a bad header after the blank line (in the body) is not a header. */
    const char *head = "Content-Length: 3\r\n\r\nContent-Length: x\r\n";
    const char *why = NULL;
    assert_int_equal(front_door_check_framing(head, strlen(head), &why), 0);
}

/* What the hand_over callback received. */
typedef struct {
    pthread_mutex_t mu;
    int fds[16];
    int n;
} Received;

static int take(void *ctx, int fd, const struct sockaddr *addr, socklen_t len) {
    (void)addr, (void)len;
    Received *r = ctx;
    pthread_mutex_lock(&r->mu);
    if (r->n < 16) r->fds[r->n++] = fd;
    else close(fd);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

static int received(Received *r) {
    pthread_mutex_lock(&r->mu);
    int n = r->n;
    pthread_mutex_unlock(&r->mu);
    return n;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int wait_received(Received *r, int want) {
    for (int i = 0; i < 200 && received(r) < want; i++) sleep_ms(10);
    return received(r);
}

static int connect_and_send(int port, const char *bytes) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr)) fail_msg("cannot connect to the front door");
    if (send(fd, bytes, strlen(bytes), 0) != (ssize_t)strlen(bytes)) fail_msg("send failed");
    return fd;
}

/* What the server sent on fd within timeout_ms, NUL-terminated ("" when it closed without a word). */
static void read_answer(int fd, char *buf, size_t cap, int timeout_ms) {
    size_t n = 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (n + 1 < cap && poll(&p, 1, timeout_ms) == 1) {
        ssize_t k = recv(fd, buf + n, cap - 1 - n, 0);
        if (k <= 0) break;
        n += (size_t)k;
    }
    buf[n] = '\0';
}

static void test_front_door_live(void **state) {
    (void)state;
    Received got = {.mu = PTHREAD_MUTEX_INITIALIZER};
    FrontDoorConfig cfg = {.host = "127.0.0.1", .port = 0, .inspect_request_line = true, .max_pending_per_client = 4,
                           .max_pending = 64, .line_timeout_s = 0.5, .hand_over = take, .hand_over_ctx = &got};
    BraidError err;
    FrontDoor *door = front_door_start(&cfg, &err);
    if (!door) fail_msg("%s", err.msg);
    int port = front_door_port(door);
    assert_true(port > 0);

    /* A complete request line is handed over, with everything still unread in the socket. */
    int c = connect_and_send(port, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_int_equal(wait_received(&got, 1), 1);
    char buf[512];
    ssize_t n = recv(got.fds[0], buf, sizeof buf - 1, 0);
    assert_true(n > 0);
    buf[n] = '\0';
    assert_true(strncmp(buf, "GET /health HTTP/1.1\r\n", 22) == 0);
    close(got.fds[0]);
    close(c);

    /* A garbage request line: a JSON 400, then the connection is closed. */
    c = connect_and_send(port, "GARBAGE\r\n\r\n");
    read_answer(c, buf, sizeof buf, 2000);
    assert_true(strncmp(buf, "HTTP/1.1 400 Bad Request\r\n", 26) == 0);
    assert_non_null(strstr(buf, "Content-Type: application/json"));
    assert_non_null(strstr(buf, "{\"error\":{\"message\":\"malformed request line"));
    close(c);

    /* Framing libmicrohttpd mishandles: a JSON answer with one status line, then the connection is
     * closed; nothing is handed over. */
    struct {
        const char *request, *status_line, *says;
    } framing[] = {
        {"POST /v1/completions HTTP/1.1\r\nContent-Length: abc\r\n\r\n", "HTTP/1.1 400 Bad Request\r\n", "Content-Length must be"},
        {"POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n{}", "HTTP/1.1 400 ", "disagree"},
        {"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", "HTTP/1.1 501 Not Implemented\r\n", "chunked"},
        {"POST /v1/messages HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", "HTTP/1.1 413 ", "larger than"},
    };
    for (size_t i = 0; i < sizeof framing / sizeof framing[0]; i++) {
        c = connect_and_send(port, framing[i].request);
        read_answer(c, buf, sizeof buf, 2000);
        if (strncmp(buf, framing[i].status_line, strlen(framing[i].status_line)) != 0 || !strstr(buf, framing[i].says) ||
            !strstr(buf, "\r\n\r\n{\"error\":{\"message\":") || strstr(buf + 5, "HTTP/1.1"))
            fail_msg("framing case %zu: got '%s'", i, buf);
        close(c);
    }
    assert_int_equal(received(&got), 1);
    /* A sound header block with a body is handed over as before. */
    c = connect_and_send(port, "POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}");
    assert_int_equal(wait_received(&got, 2), 2);
    close(got.fds[1]);
    close(c);

    /* Six half-sent lines from one client with room for four: the two oldest get a 408. */
    int partial[6];
    for (int i = 0; i < 6; i++) {
        partial[i] = connect_and_send(port, "POST /v1/chat/compl");
        sleep_ms(20); /* accepted in this order */
    }
    for (int i = 0; i < 2; i++) {
        read_answer(partial[i], buf, sizeof buf, 2000);
        assert_true(strncmp(buf, "HTTP/1.1 408 ", 13) == 0);
    }
    /* ... and a new, well-behaved connection from the same client still gets in. */
    c = connect_and_send(port, "GET /metrics HTTP/1.1\r\n\r\n");
    assert_int_equal(wait_received(&got, 3), 3);
    close(got.fds[2]);
    close(c);
    /* The rest time out after line_timeout_s. */
    for (int i = 2; i < 6; i++) {
        read_answer(partial[i], buf, sizeof buf, 3000);
        assert_true(strncmp(buf, "HTTP/1.1 408 ", 13) == 0);
        assert_non_null(strstr(buf, "\"error\""));
        close(partial[i]);
    }
    for (int i = 0; i < 2; i++) close(partial[i]);
    assert_int_equal(received(&got), 3);
    front_door_stop(door);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_line),
        cmocka_unit_test(test_framing),
        cmocka_unit_test(test_front_door_live),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
