/* Keeping a thread team off its master's CPU.
 *
 * After the machine idles, Linux may wake a team's sleeping thread on the CPU of the thread
 * that wakes it (the master, which calls pyw8a8 from Python), and leave it there while the
 * other CPUs idle.  Stacked, the worker runs only once the master stops spinning at the
 * region's end barrier (libgomp's spin, GOMP_SPINCOUNT=10000 under pyw8a8's thread policy:
 * about 0.5 ms), and the scheduler did not move it away, call after call (2 Xeon vCPUs:
 * after half a second of idling, 16 rows through 640 x 2048 took up to 20x as long, both
 * threads on one CPU).  So each worker that
 * finds itself on its master's CPU leaves it: its affinity becomes the master's, less that
 * CPU, which also keeps the next wake-up from stacking it there again.  It costs one
 * sched_getcpu per thread and region; the move, a few syscalls, only when stacked.  A
 * process restricted to one CPU (taskset) is left alone.  Elsewhere than Linux, nothing. */
#ifndef PYW8A8_SIMD_TEAM_H
#define PYW8A8_SIMD_TEAM_H

#include "common.h"
#if defined(_OPENMP)
#include <omp.h>
#endif

/* Where the master of a region runs, read before the region. */
typedef struct {
    int cpu; /* -1: unknown, nothing to do */
} w8_master_place;

#if defined(__linux__)
#include <sched.h>
#include <unistd.h>

static inline w8_master_place w8_master_here(void)
{
    w8_master_place place = {sched_getcpu()};
    return place;
}

/* Moves the calling thread off the master's CPU when it runs there, to the CPUs of the
 * process's main thread (those the process was started on) less that one; returns 1 if it
 * moved.  For the workers of a region, not its master (w8_join_team). */
static inline int w8_leave_master_cpu(w8_master_place master)
{
    if (master.cpu < 0 || sched_getcpu() != master.cpu) return 0;
    cpu_set_t mask;
    if (sched_getaffinity(getpid(), sizeof(mask), &mask) != 0) return 0;
    CPU_CLR(master.cpu, &mask);
    return CPU_COUNT(&mask) > 0 && sched_setaffinity(0, sizeof(mask), &mask) == 0;
}

#else

static inline w8_master_place w8_master_here(void)
{
    w8_master_place place = {-1};
    return place;
}

static inline int w8_leave_master_cpu(w8_master_place master)
{
    (void)master;
    return 0;
}

#endif

/* The start of each thread's part of a parallel region whose master ran w8_master_here
 * before it: the workers leave the master's CPU. */
static inline void w8_join_team(w8_master_place master)
{
#if defined(_OPENMP)
    if (omp_get_thread_num() != 0) w8_leave_master_cpu(master);
#else
    (void)master;
#endif
}

#endif
