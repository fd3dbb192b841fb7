/* Small-file driver for bench/metadata.sh: create, stat, readdir or
 * unlink N empty (or SIZE-byte) files spread over D directories under a
 * root, in P processes that each own every P-th directory. Prints one JSON
 * object: the phase, the operations done, the wall time of the phase (from
 * the moment every process is ready to the moment the last one finishes),
 * and the errors seen.
 *
 *   smallfiles PHASE ROOT FILES DIRS PROCS [SIZE]
 *   PHASE: create | stat | readdir | unlink | rmdir
 *
 * create also makes the directories (not timed apart); rmdir removes them.
 * Names are ROOT/dNNNN/fNNNNNNN; file i lives in directory i % DIRS. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

struct shared {
    volatile int ready;
    volatile long ops;
    volatile long errors;
    volatile int first_errno;
};

static void fail_usage(void) {
    fprintf(stderr, "usage: smallfiles create|stat|readdir|unlink|rmdir ROOT FILES DIRS PROCS [SIZE]\n");
    exit(2);
}

/* The work of process `me`: every directory d with d % procs == me. */
static void work(const char *phase, const char *root, long files, long dirs, int procs, int me,
                 long size, long *ops, long *errors, int *first_errno) {
    char path[4096];
    char *buf = NULL;
    if (size > 0) {
        buf = malloc(size);
        if (!buf) exit(3);
        memset(buf, 'x', size);
    }
#define ERR() do { (*errors)++; if (!*first_errno) *first_errno = errno; } while (0)
    for (long d = me; d < dirs; d += procs) {
        if (!strcmp(phase, "readdir")) {
            snprintf(path, sizeof path, "%s/d%04ld", root, d);
            DIR *dh = opendir(path);
            if (!dh) { ERR(); continue; }
            struct dirent *e;
            while ((e = readdir(dh)) != NULL) {
                if (e->d_name[0] != '.') (*ops)++;
            }
            closedir(dh);
            continue;
        }
        if (!strcmp(phase, "rmdir")) {
            snprintf(path, sizeof path, "%s/d%04ld", root, d);
            if (rmdir(path)) ERR(); else (*ops)++;
            continue;
        }
        for (long i = d; i < files; i += dirs) {
            snprintf(path, sizeof path, "%s/d%04ld/f%07ld", root, d, i);
            if (!strcmp(phase, "create")) {
                int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0644);
                if (fd < 0) { ERR(); continue; }
                if (size > 0 && write(fd, buf, size) != size) ERR();
                if (close(fd)) ERR();
                (*ops)++;
            } else if (!strcmp(phase, "stat")) {
                struct stat st;
                if (lstat(path, &st)) ERR(); else (*ops)++;
            } else if (!strcmp(phase, "unlink")) {
                if (unlink(path)) ERR(); else (*ops)++;
            } else {
                fail_usage();
            }
        }
    }
    free(buf);
}

int main(int argc, char **argv) {
    if (argc < 6 || argc > 7) fail_usage();
    const char *phase = argv[1], *root = argv[2];
    long files = atol(argv[3]), dirs = atol(argv[4]);
    int procs = atoi(argv[5]);
    long size = argc == 7 ? atol(argv[6]) : 0;
    if (files < 0 || dirs < 1 || procs < 1 || size < 0) fail_usage();
    if (strcmp(phase, "create") && strcmp(phase, "stat") && strcmp(phase, "readdir") &&
        strcmp(phase, "unlink") && strcmp(phase, "rmdir"))
        fail_usage();

    char path[4096];
    if (!strcmp(phase, "create")) {
        for (long d = 0; d < dirs; d++) {
            snprintf(path, sizeof path, "%s/d%04ld", root, d);
            if (mkdir(path, 0755) && errno != EEXIST) {
                fprintf(stderr, "mkdir %s: %s\n", path, strerror(errno));
                return 1;
            }
        }
    }

    struct shared *sh = mmap(NULL, sizeof *sh * (procs + 1), PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) return 3;
    memset(sh, 0, sizeof *sh * (procs + 1));
    int go[2];
    if (pipe(go)) return 3;
    for (int p = 0; p < procs; p++) {
        pid_t pid = fork();
        if (pid < 0) return 3;
        if (pid == 0) {
            close(go[1]);
            __sync_fetch_and_add(&sh[procs].ready, 1);
            char c;
            /* Start together: everyone blocks until the parent closes the pipe. */
            if (read(go[0], &c, 1) < 0) _exit(4);
            long ops = 0, errors = 0;
            int first = 0;
            work(phase, root, files, dirs, procs, p, size, &ops, &errors, &first);
            sh[p].ops = ops;
            sh[p].errors = errors;
            sh[p].first_errno = first;
            _exit(0);
        }
    }
    close(go[0]);
    while (sh[procs].ready < procs) usleep(1000);
    double t0 = now();
    close(go[1]);
    int bad = 0;
    for (int p = 0; p < procs; p++) {
        int st;
        if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) bad = 1;
    }
    double t1 = now();
    long ops = 0, errors = 0;
    int first = 0;
    for (int p = 0; p < procs; p++) {
        ops += sh[p].ops;
        errors += sh[p].errors;
        if (!first) first = sh[p].first_errno;
    }
    printf("{\"phase\": \"%s\", \"procs\": %d, \"ops\": %ld, \"secs\": %.6f, \"errors\": %ld, \"first_error\": \"%s\"}\n",
           phase, procs, ops, t1 - t0, errors, first ? strerror(first) : "");
    return bad || errors ? 1 : 0;
}
