// The MPI side of `benches/run-comparison`: a blocking ping-pong between rank 0 and
// rank 1 that does what `transport/pingpong_consumed/shm` does, so the two compare.
//
// Rank 0 stamps a sequence number into the first 8 bytes of its message, sends it
// (MPI_Send) and waits for the echo (MPI_Recv); rank 1 receives it and sends back the
// buffer it arrived in. Both sides read every byte they receive: they sum the message as
// 64-bit little-endian words and check the sum against the sender's, as the tierbuf
// bench's receivers do (`tierbuf_benches::messages::Reading::Whole`). Byte i of a
// message is (i * 7 + 3) mod 256, as in the tierbuf bench.
//
// The figure is the one-way time, round trip / 2. Per size: a warm-up of WARMUP seconds,
// then SAMPLES samples of equal iteration counts filling MEASURE seconds in all, as
// criterion takes them; it prints the median, the smallest and the largest sample.
//
// Build: mpicc -O2 -o pingpong pingpong.c
// Run:   mpirun -np 2 --bind-to core --map-by core ./pingpong [-w WARMUP] [-m MEASURE]
//            [-s SAMPLES] SIZE...
// Prints (rank 0), one line a size: "pingpong SIZE MEDIAN_NS MIN_NS MAX_NS ITERATIONS".
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t word_sum(const unsigned char *bytes, size_t len) {
    uint64_t sum = 0, word;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        memcpy(&word, bytes + i, 8);
        sum += word;
    }
    if (i < len) {
        word = 0;
        memcpy(&word, bytes + i, len - i);
        sum += word;
    }
    return sum;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

struct side {
    int rank;
    unsigned char *out;  // rank 0's message
    unsigned char *in;   // where a message lands
    size_t size;
    uint64_t rest;       // the word sum of a message less its first word
    uint64_t seq;
};

// Reads every byte of the message in `side->in` and checks it is message `seq`.
static void check(const struct side *side, uint64_t seq) {
    if (word_sum(side->in, side->size) != seq + side->rest) {
        fprintf(stderr, "pingpong: rank %d: message %llu of %zu bytes is wrong\n", side->rank,
                (unsigned long long)seq, side->size);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
}

// `count` round trips; returns the time of rank 0's loop (rank 1's is not used).
static double round_trips(struct side *side, long count) {
    int peer = 1 - side->rank;
    int len = (int)side->size;
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    for (long i = 0; i < count; i++) {
        uint64_t seq = side->seq++;
        if (side->rank == 0) {
            memcpy(side->out, &seq, 8);
            MPI_Send(side->out, len, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
            MPI_Recv(side->in, len, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            check(side, seq);
        } else {
            MPI_Recv(side->in, len, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            check(side, seq);
            MPI_Send(side->in, len, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
        }
    }
    return MPI_Wtime() - start;
}

static void usage(void) {
    fprintf(stderr, "usage: pingpong [-w WARMUP_S] [-m MEASURE_S] [-s SAMPLES] SIZE...\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, ranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    if (ranks != 2) {
        if (rank == 0) fprintf(stderr, "pingpong: needs exactly 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    double warmup = 1.0, measure = 2.0;
    int samples = 20, opt;
    while ((opt = getopt(argc, argv, "w:m:s:")) != -1) {
        switch (opt) {
        case 'w': warmup = atof(optarg); break;
        case 'm': measure = atof(optarg); break;
        case 's': samples = atoi(optarg); break;
        default: usage();
        }
    }
    if (optind == argc || samples < 1 || measure <= 0 || warmup < 0) usage();

    double *sample = calloc((size_t)samples, sizeof *sample);
    for (int a = optind; a < argc; a++) {
        long parsed = atol(argv[a]);
        if (parsed < 8 || parsed > (1L << 30)) usage();
        struct side side = {.rank = rank, .size = (size_t)parsed};
        side.out = aligned_alloc(4096, (side.size + 4095) / 4096 * 4096);
        side.in = aligned_alloc(4096, (side.size + 4095) / 4096 * 4096);
        for (size_t i = 0; i < side.size; i++) side.out[i] = (unsigned char)(i * 7 + 3);
        memset(side.in, 0, side.size);
        side.rest = word_sum(side.out + 8, side.size - 8);

        // Warm up with doubling batches until WARMUP has passed; rank 0 decides each
        // batch's length and the per-sample count from the last batch's time.
        long batch = 1, per_sample;
        double spent = 0, last = 0;
        for (;;) {
            int more = 1;
            if (rank == 0) more = spent < warmup || last == 0;
            MPI_Bcast(&more, 1, MPI_INT, 0, MPI_COMM_WORLD);
            if (!more) break;
            last = round_trips(&side, batch);
            MPI_Bcast(&last, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
            spent += last;
            if (spent < warmup) batch *= 2;
        }
        per_sample = (long)(measure / samples / (last / batch));
        if (per_sample < 1) per_sample = 1;
        MPI_Bcast(&per_sample, 1, MPI_LONG, 0, MPI_COMM_WORLD);

        for (int s = 0; s < samples; s++)
            sample[s] = round_trips(&side, per_sample) * 1e9 / (2.0 * per_sample);
        qsort(sample, (size_t)samples, sizeof *sample, by_value);
        if (rank == 0) {
            printf("pingpong %zu %.1f %.1f %.1f %ld\n", side.size, sample[samples / 2],
                   sample[0], sample[samples - 1], per_sample * samples);
            fflush(stdout);
        }
        free(side.out);
        free(side.in);
    }
    free(sample);
    MPI_Finalize();
    return 0;
}
