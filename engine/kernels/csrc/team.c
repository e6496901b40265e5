/* Where the engine's OpenMP team runs: one thread per core, each kept on its own. */
#define _GNU_SOURCE /* sched_setaffinity, before any header */
#include <omp.h>
#include <sched.h>

#include "kernels.h"

/* Keep thread i of the calling thread's team of `count` threads (libgomp reuses the same
 * threads for every team of that size or smaller) on CPU cpus[i]; returns how many threads
 * were kept so, 0 where no thread can be (not Linux). Two threads of the team on one core
 * wait for each other at every parallel region of a round. */
int ferry_pin_team(const int32_t *cpus, int count) {
    int pinned = 0;
#ifdef __linux__
#pragma omp parallel num_threads(count) reduction(+ : pinned)
    {
        const int cpu = cpus[omp_get_thread_num()];
        if (cpu >= 0 && cpu < CPU_SETSIZE) {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(cpu, &set);
            pinned += sched_setaffinity(0, sizeof set, &set) == 0;
        }
    }
#else
    (void)cpus;
    (void)count;
#endif
    return pinned;
}
