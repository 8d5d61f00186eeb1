#include "cpu_features.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

// Swift cannot ask the processor what it supports; clang's builtin reads CPUID once per process, and its
// answers for AVX2 and AVX-512 also check (XGETBV) that the OS saves the YMM and ZMM registers.
int attune_cpu_runs_kernels(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("x86-64-v3");
#else
    return 1;
#endif
}

unsigned attune_cpu_feature_bits(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    unsigned bits = ATTUNE_CPU_X86_64;
    if (__builtin_cpu_supports("avx2")) bits |= ATTUNE_CPU_AVX2;
    if (__builtin_cpu_supports("fma")) bits |= ATTUNE_CPU_FMA;
    if (__builtin_cpu_supports("avx512f")) bits |= ATTUNE_CPU_AVX512F;
    if (__builtin_cpu_supports("avx512dq")) bits |= ATTUNE_CPU_AVX512DQ;
    if (__builtin_cpu_supports("avx512bw")) bits |= ATTUNE_CPU_AVX512BW;
    if (__builtin_cpu_supports("avx512vl")) bits |= ATTUNE_CPU_AVX512VL;
    return bits;
#else
    return 0;
#endif
}

// BLIS's own API, declared here: blis.h cannot be included beside the CBLAS header the rest of Attune uses.
// `arch_t` is an enum, passed as an int.
extern int bli_arch_query_id(void);
extern char *bli_arch_string(int id);
extern void bli_init(void);

#define ATTUNE_BLIS_MAX_ARCHS 64

const char *attune_blis_arch_name(int id) {
    // Ids run from 0 to "generic"; past it bli_arch_string would read outside its table.
    for (int i = 0; i < ATTUNE_BLIS_MAX_ARCHS; i++) {
        const char *name = bli_arch_string(i);
        if (i == id) return name;
        if (name == NULL || strcmp(name, "generic") == 0) return NULL;
    }
    return NULL;
}

int attune_blis_probe_arch(int forced) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    pid_t child = fork();
    if (child < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (child == 0) {
        // The child only asks BLIS and leaves with _exit: no atexit handlers or buffers of the parent's run.
        close(fds[0]);
        // What BLIS prints (BLIS_ARCH_DEBUG, or its message when a requested id is missing) stays out of the
        // parent's logs: the answer is the id alone.
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) {
            dup2(devnull, STDOUT_FILENO);
            dup2(devnull, STDERR_FILENO);
        }
        if (forced >= 0) {
            char value[16];
            snprintf(value, sizeof value, "%d", forced);
            setenv("BLIS_ARCH_TYPE", value, 1);
            // BLIS checks a requested id against its registered contexts, which exist only once it is
            // initialized; a configuration not built into this library aborts here, in the child.
            bli_init();
        } else {
            unsetenv("BLIS_ARCH_TYPE");
        }
        int id = bli_arch_query_id();
        ssize_t written = write(fds[1], &id, sizeof id);
        _exit(written == (ssize_t)sizeof id ? 0 : 1);
    }
    close(fds[1]);
    int id = -1;
    ssize_t got = read(fds[0], &id, sizeof id);
    close(fds[0]);
    int status = 0;
    while (waitpid(child, &status, 0) < 0) {
        // EINTR: a signal arrived while the child ran; anything else means no child to wait for.
        if (errno == EINTR) continue;
        break;
    }
    if (got != (ssize_t)sizeof id || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
    return id;
}
