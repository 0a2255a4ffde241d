/*
 * adapter_select (coord/adapter_select.h): which model a request runs, from its model name and its
 * adapter field/header, against the adapters the server loaded; unknown names are 404s with the
 * OpenAI-style codes, a model and an adapter naming different adapters a 400.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "coord/adapter_select.h"

#define SERVED "SmolLM2-135M-Instruct.Q4_1"

static LoraAdapter adapters[2] = {{.name = "coder"}, {.name = "planner"}};
static const LoraSet loaded = {.n = 2, .adapters = adapters};

/* Runs adapter_select on a request with these model / adapter values (NULL = absent). */
static int select_for(const char *model, const char *adapter, const LoraSet *lora, ApiRequest *a, ApiError *e) {
    memset(a, 0, sizeof *a);
    a->model = model ? strdup(model) : NULL;
    a->adapter = adapter ? strdup(adapter) : NULL;
    memset(e, 0, sizeof *e);
    return adapter_select(a, SERVED, lora, e);
}

static void test_base_model(void **state) {
    (void)state;
    ApiRequest a;
    ApiError e;
    assert_int_equal(select_for(NULL, NULL, &loaded, &a, &e), 0);
    assert_null(a.adapter);
    api_request_free(&a);
    assert_int_equal(select_for(SERVED, NULL, &loaded, &a, &e), 0);
    assert_null(a.adapter);
    api_request_free(&a);
}

static void test_adapter_by_field_or_model(void **state) {
    (void)state;
    ApiRequest a;
    ApiError e;
    assert_int_equal(select_for(SERVED, "planner", &loaded, &a, &e), 0);
    assert_string_equal(a.adapter, "planner");
    api_request_free(&a);
    assert_int_equal(select_for("coder", NULL, &loaded, &a, &e), 0);
    assert_string_equal(a.adapter, "coder");
    api_request_free(&a);
    assert_int_equal(select_for("coder", "coder", &loaded, &a, &e), 0);
    assert_string_equal(a.adapter, "coder");
    api_request_free(&a);
}

static void test_refusals(void **state) {
    (void)state;
    ApiRequest a;
    ApiError e;
    assert_int_equal(select_for(NULL, "tester", &loaded, &a, &e), -1);
    assert_int_equal(e.status, 404);
    assert_string_equal(e.code, "adapter_not_found");
    assert_string_equal(e.param, "adapter");
    assert_non_null(strstr(e.message, "'tester'"));
    assert_non_null(strstr(e.message, "'coder', 'planner'"));
    api_request_free(&a);
    assert_int_equal(select_for("gpt-4", NULL, &loaded, &a, &e), -1);
    assert_int_equal(e.status, 404);
    assert_string_equal(e.code, "model_not_found");
    assert_non_null(strstr(e.message, SERVED));
    assert_non_null(strstr(e.message, "'coder'"));
    api_request_free(&a);
    assert_int_equal(select_for("coder", "planner", &loaded, &a, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "adapter");
    api_request_free(&a);
    /* no adapters loaded: any adapter is unknown, and the message says how to load one */
    assert_int_equal(select_for(NULL, "coder", NULL, &a, &e), -1);
    assert_int_equal(e.status, 404);
    assert_non_null(strstr(e.message, "--lora"));
    api_request_free(&a);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_base_model), cmocka_unit_test(test_adapter_by_field_or_model),
                                       cmocka_unit_test(test_refusals)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
