/* The memory of the products' large float outputs, numpy's arrays (pyw8a8._outputs) and
 * the torch operator's tensors (call.h's output_take) alike: posix_memalign's, 64-byte
 * aligned (no zmm store or tile row straddles two lines) and without the huge-page advice
 * numpy gives arrays from 4 MiB on (an 18 MiB array took 5.6x as long to allocate and
 * fill with it, Zen 5).  Freed, it is kept for the next output of about its size: a
 * model's layers allocate outputs of the same few shapes call after call, and memory
 * returned to the system comes back as fresh pages, faulted and zeroed on the first write
 * (1 x 64 x 1152 x 6912 cost 182 us over its product so, on the torch operator). */
#ifndef PYW8A8_SIMD_OUTPUTS_H
#define PYW8A8_SIMD_OUTPUTS_H

#include <pthread.h>
#include <stdlib.h>

#define W8_OUTPUT_ALIGN 64
#define W8_KEPT_OUTPUTS 8                       /* freed buffers kept at most */
#define W8_KEPT_OUTPUT_BYTES ((size_t)1 << 28)  /* and at most this many bytes of them */

static struct {
    pthread_mutex_t lock;
    void *memory[W8_KEPT_OUTPUTS]; /* oldest first */
    size_t size[W8_KEPT_OUTPUTS];
    int count;
    size_t bytes;
} w8_kept_outputs = {PTHREAD_MUTEX_INITIALIZER, {0}, {0}, 0, 0};

/* Stop keeping buffer i (the newer ones move down one place); the lock held. */
static void w8_unkeep_output(int i)
{
    w8_kept_outputs.bytes -= w8_kept_outputs.size[i];
    for (int j = i; j < w8_kept_outputs.count - 1; j++) {
        w8_kept_outputs.memory[j] = w8_kept_outputs.memory[j + 1];
        w8_kept_outputs.size[j] = w8_kept_outputs.size[j + 1];
    }
    w8_kept_outputs.count--;
}

/* Memory for `bytes`, and its size in *size: the newest kept buffer of bytes to 2 bytes,
 * else fresh; NULL where none could be had. */
static void *w8_output_take(size_t bytes, size_t *size)
{
    void *memory = NULL;
    pthread_mutex_lock(&w8_kept_outputs.lock);
    for (int i = w8_kept_outputs.count - 1; i >= 0; i--) {
        if (bytes <= w8_kept_outputs.size[i] && w8_kept_outputs.size[i] <= 2 * bytes) {
            memory = w8_kept_outputs.memory[i];
            *size = w8_kept_outputs.size[i];
            w8_unkeep_output(i);
            break;
        }
    }
    pthread_mutex_unlock(&w8_kept_outputs.lock);
    if (memory != NULL) return memory;
    if (posix_memalign(&memory, W8_OUTPUT_ALIGN, bytes ? bytes : W8_OUTPUT_ALIGN) != 0)
        return NULL;
    *size = bytes;
    return memory;
}

/* Keep a freed output's memory, dropping the oldest kept to stay within the limits; free
 * it where it alone exceeds them. */
static void w8_output_give(void *memory, size_t size)
{
    void *dropped[W8_KEPT_OUTPUTS + 1];
    int ndropped = 0;
    if (size > W8_KEPT_OUTPUT_BYTES) {
        free(memory);
        return;
    }
    pthread_mutex_lock(&w8_kept_outputs.lock);
    while (w8_kept_outputs.count == W8_KEPT_OUTPUTS ||
           w8_kept_outputs.bytes + size > W8_KEPT_OUTPUT_BYTES) {
        dropped[ndropped++] = w8_kept_outputs.memory[0];
        w8_unkeep_output(0);
    }
    w8_kept_outputs.memory[w8_kept_outputs.count] = memory;
    w8_kept_outputs.size[w8_kept_outputs.count++] = size;
    w8_kept_outputs.bytes += size;
    pthread_mutex_unlock(&w8_kept_outputs.lock);
    for (int i = 0; i < ndropped; i++) free(dropped[i]);
}

static size_t w8_kept_output_bytes(void)
{
    pthread_mutex_lock(&w8_kept_outputs.lock);
    const size_t bytes = w8_kept_outputs.bytes;
    pthread_mutex_unlock(&w8_kept_outputs.lock);
    return bytes;
}

static void w8_outputs_lock_take(void) { pthread_mutex_lock(&w8_kept_outputs.lock); }
static void w8_outputs_lock_give(void) { pthread_mutex_unlock(&w8_kept_outputs.lock); }

/* Once per process, at import: a fork takes the lock, so a child never inherits it held. */
static int w8_outputs_init(void)
{
    return pthread_atfork(w8_outputs_lock_take, w8_outputs_lock_give, w8_outputs_lock_give);
}

#endif
