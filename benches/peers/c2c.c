// The cross-core round trip: one cache line handed from CPU 0 to CPU 1 and back, the
// floor under any shared-memory handoff between two pinned processes. A one-way message
// time can never be below half of it. On a virtual machine it moves with where the host
// places the two vCPUs, so `benches/run-comparison` reads it in every round.
//
// Build: gcc -O2 -pthread -o c2c c2c.c
// Run:   ./c2c [ROUND_TRIPS]   (default 200000)
// Prints one line: "c2c_ns <median> <min> <max>" over 7 repetitions of ROUND_TRIPS.
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define REPS 7

static _Alignas(128) _Atomic long ping;
static _Alignas(128) _Atomic long pong;
static long round_trips = 200000;

static int pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void *responder(void *arg) {
    (void)arg;
    if (pin(1) != 0) {
        fprintf(stderr, "c2c: cannot pin to CPU 1\n");
        exit(1);
    }
    for (long i = 1; i <= round_trips * REPS; i++) {
        while (atomic_load_explicit(&ping, memory_order_acquire) != i) {
        }
        atomic_store_explicit(&pong, i, memory_order_release);
    }
    return NULL;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc > 1) round_trips = atol(argv[1]);
    if (round_trips <= 0) {
        fprintf(stderr, "usage: c2c [ROUND_TRIPS > 0]\n");
        return 2;
    }
    if (pin(0) != 0) {
        fprintf(stderr, "c2c: cannot pin to CPU 0\n");
        return 1;
    }
    pthread_t thread;
    pthread_create(&thread, NULL, responder, NULL);
    double rep[REPS];
    long i = 0;
    for (int r = 0; r < REPS; r++) {
        double start = now_ns();
        for (long j = 0; j < round_trips; j++) {
            i++;
            atomic_store_explicit(&ping, i, memory_order_release);
            while (atomic_load_explicit(&pong, memory_order_acquire) != i) {
            }
        }
        rep[r] = (now_ns() - start) / round_trips;
    }
    pthread_join(thread, NULL);
    qsort(rep, REPS, sizeof rep[0], by_value);
    printf("c2c_ns %.1f %.1f %.1f\n", rep[REPS / 2], rep[0], rep[REPS - 1]);
    return 0;
}
