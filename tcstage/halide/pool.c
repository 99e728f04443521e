/* tcstage's thread pool for the pipelines of the CPU kernel cache (tcstage/halide/aot.py).

   Linked into the shared Halide runtime library and installed with
   halide_set_custom_do_par_for, so every parallel loop of a cached pipeline runs here.

   Why not Halide's own pool: its workers go to sleep almost as soon as a loop ends, and waking a
   sleeping thread took 50-100 us on the 2-vCPU development machine (a hypervisor has to wake
   the idle vCPU). A layer's pass over a 512x1024 tensor takes about that long, so the second
   thread joined when the work was nearly done: a parallel copy ran 0.25 ms against 0.27 on one
   thread. Here the workers spin for a while after each loop (as OpenMP runtimes do, PyTorch's
   included) before they sleep, so the next loop of a layer, or of the next layer, finds them
   awake. Why no OpenMP runtime of tcstage's own: GNU libgomp cannot run a parallel region in a
   child forked after the parent used one (the tuner forks its workers), and PyTorch bundles a
   libgomp of its own, so a second runtime would be loaded next to it. Where PyTorch has loaded
   one, loops run on its team instead (tcstage_pool_share_openmp, below).

   Rules:
   - one loop at a time: a loop started while another runs (a nested parallel loop, or a second
     Python thread's kernel) runs serially on its own thread;
   - the calling thread works too, claiming tasks like the workers;
   - workers are started on the first loop of each process, so a forked child starts its own;
   - the first nonzero status of a task is the loop's status, as in Halide's pool. */

#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

typedef int (*halide_task_t)(void *user_context, int task_number, uint8_t *closure);
typedef int (*halide_do_par_for_t)(void *, halide_task_t, int, int, uint8_t *);
extern halide_do_par_for_t halide_set_custom_do_par_for(halide_do_par_for_t);

typedef struct {
    halide_task_t task;
    void *user_context;
    uint8_t *closure;
    int min, extent;
    atomic_int next, finished, status;
} loop_t;

static _Atomic(loop_t *) current;  /* the loop being run, or NULL */
static atomic_uint posted;         /* loops posted so far: idle workers wait for it to change */
static atomic_int reading;         /* workers that may be reading `current` */
static atomic_int sleepers;        /* workers asleep on `wake` */
static atomic_int busy;            /* a loop is running */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static int threads = 1;            /* workers + the calling thread */
static long spin_ns;               /* how long an idle worker spins before it sleeps */
static pid_t started_in;           /* the process whose workers are running */

static void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void run_tasks(loop_t *loop) {
    for (;;) {
        int i = atomic_fetch_add(&loop->next, 1);
        if (i >= loop->extent) return;
        int status = loop->task(loop->user_context, loop->min + i, loop->closure);
        if (status != 0) {
            int none = 0;
            atomic_compare_exchange_strong(&loop->status, &none, status);
        }
        atomic_fetch_add(&loop->finished, 1);
    }
}

static void wait_for_post(unsigned seen) {
    long start = now_ns();
    for (unsigned spins = 1; atomic_load(&posted) == seen; spins++) {
        relax();
        if (spins % 256 == 0) {
            if (now_ns() - start < spin_ns) {
                sched_yield();  /* (lets a runnable thread have this core while we wait) */
                continue;
            }
            pthread_mutex_lock(&lock);
            atomic_fetch_add(&sleepers, 1);
            while (atomic_load(&posted) == seen)
                pthread_cond_wait(&wake, &lock);
            atomic_fetch_sub(&sleepers, 1);
            pthread_mutex_unlock(&lock);
            return;
        }
    }
}

static void *worker(void *unused) {
    (void)unused;
    unsigned seen = atomic_load(&posted);
    for (;;) {
        wait_for_post(seen);
        seen = atomic_load(&posted);
        /* Counted before reading `current`: the caller returns, and its loop goes out of
           scope, only once no worker is reading (see tcstage_do_par_for). */
        atomic_fetch_add(&reading, 1);
        loop_t *loop = atomic_load(&current);
        if (loop != NULL)
            run_tasks(loop);
        atomic_fetch_sub(&reading, 1);
    }
    return NULL;
}

static void start_workers(void) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int started = 1;
    for (int k = 1; k < threads; k++) {
        pthread_t t;
        if (pthread_create(&t, &attr, worker, NULL) == 0) {
            started++;
#ifdef __linux__
            pthread_setname_np(t, "tcstage-pool");
#endif
        }
    }
    pthread_attr_destroy(&attr);
    threads = started;
    started_in = getpid();
}

static int run_serially(void *user_context, halide_task_t task, int min, int extent,
                        uint8_t *closure) {
    for (int i = 0; i < extent; i++) {
        int status = task(user_context, min + i, closure);
        if (status != 0)
            return status;
    }
    return 0;
}

/* PyTorch's OpenMP team, where tcstage_pool_share_openmp was given its GOMP_parallel: loops
   then run on the threads PyTorch's own operators run on, which spin for a while after each
   region. With two pools, each one's spinning threads held the cores the other's next loop
   needed: a 512x1024 softmax called between PyTorch operators took 0.45 ms instead of 0.26.
   As many of them as PyTorch's own operators would use on the calling thread
   (omp_get_max_threads: torch.set_num_threads sets it), and no more than this pool's count:
   torch.set_num_threads(1) makes a kernel serial, as it makes PyTorch's operators.
   Only in the process that shared it: a forked child's copy of the team is not usable. */
typedef void (*gomp_parallel_t)(void (*)(void *), void *, unsigned, unsigned);
typedef int (*omp_max_threads_t)(void);
static gomp_parallel_t gomp_parallel;
static omp_max_threads_t omp_max_threads;
static pid_t gomp_in;

static void run_tasks_in_team(void *loop) { run_tasks((loop_t *)loop); }

static int tcstage_do_par_for(void *user_context, halide_task_t task, int min, int extent,
                              uint8_t *closure) {
    int idle = 0;
    int team_threads = threads;
    int shared = gomp_parallel != NULL && gomp_in == getpid();
    if (shared && omp_max_threads != NULL) {
        int wanted = omp_max_threads();
        team_threads = wanted < team_threads ? wanted : team_threads;
    }
    if (extent < 2 || team_threads < 2 || !atomic_compare_exchange_strong(&busy, &idle, 1))
        return run_serially(user_context, task, min, extent, closure);
    loop_t loop = {.task = task, .user_context = user_context, .closure = closure,
                   .min = min, .extent = extent};
    atomic_init(&loop.next, 0);
    atomic_init(&loop.finished, 0);
    atomic_init(&loop.status, 0);
    if (shared) {
        unsigned team = (unsigned)(extent < team_threads ? extent : team_threads);
        gomp_parallel(run_tasks_in_team, &loop, team, 0);  /* (returns when the team is done) */
        int status = atomic_load(&loop.status);
        atomic_store(&busy, 0);
        return status;
    }
    if (started_in != getpid())
        start_workers();
    atomic_store(&current, &loop);
    atomic_fetch_add(&posted, 1);
    if (atomic_load(&sleepers) > 0) {
        pthread_mutex_lock(&lock);
        pthread_cond_broadcast(&wake);
        pthread_mutex_unlock(&lock);
    }
    run_tasks(&loop);
    while (atomic_load(&loop.finished) < extent)
        relax();
    atomic_store(&current, NULL);
    while (atomic_load(&reading) > 0)
        relax();
    int status = atomic_load(&loop.status);
    atomic_store(&busy, 0);
    return status;
}

/* In a forked child only the forking thread exists: forget the parent's workers (the next
   loop starts new ones) and whatever they held. */
static void after_fork_in_child(void) {
    started_in = 0;
    atomic_store(&current, NULL);
    atomic_store(&reading, 0);
    atomic_store(&sleepers, 0);
    atomic_store(&busy, 0);
    pthread_mutex_init(&lock, NULL);
    pthread_cond_init(&wake, NULL);
}

/* Called by aot.py where PyTorch has loaded an OpenMP runtime: its GOMP_parallel and
   omp_get_max_threads (or NULL: this pool's count). */
void tcstage_pool_share_openmp(void *parallel, void *max_threads) {
    omp_max_threads = (omp_max_threads_t)max_threads;
    gomp_parallel = (gomp_parallel_t)parallel;
    gomp_in = getpid();
}

/* Called once, when aot.py loads the runtime library. */
int tcstage_pool_install(int thread_count, int spin_microseconds) {
    threads = thread_count < 1 ? 1 : thread_count > 256 ? 256 : thread_count;
    spin_ns = spin_microseconds < 0 ? 0 : 1000L * spin_microseconds;
    pthread_atfork(NULL, NULL, after_fork_in_child);
    halide_set_custom_do_par_for(tcstage_do_par_for);
    return threads;
}
