/* Monotonic time and deadlines. */
#include <stdint.h>
#include <sys/resource.h>

#include "base/base.h"

#define FR_NS_PER_SEC 1000000000ull
#define FR_NS_PER_MS 1000000ull

/* Timespecs past this are clamped: 2^31-1 s of monotonic time (68 years of
 * uptime) is "never" for every waiter and fits any time_t, so libc and the
 * kernel accept it without overflowing their own arithmetic. */
#define FR_FAR_FUTURE_SEC 2147483647ull

uint64_t fr_now_ns(void)
{
    struct timespec ts;

    /* CLOCK_MONOTONIC cannot fail with a valid pointer on Linux. */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * FR_NS_PER_SEC + (uint64_t)ts.tv_nsec;
}

uint64_t fr_now_ms(void)
{
    return fr_now_ns() / FR_NS_PER_MS;
}

uint64_t fr_minor_faults(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (uint64_t)ru.ru_minflt : 0;
}

/* Huge timeouts saturate to UINT64_MAX ("forever") instead of wrapping into
 * a deadline in the past. */
uint64_t fr_deadline_ns(int64_t timeout_ms)
{
    uint64_t delta, deadline;

    if (timeout_ms < 0)
        return UINT64_MAX;
    if (fr_mul_u64((uint64_t)timeout_ms, FR_NS_PER_MS, &delta) < 0)
        return UINT64_MAX;
    if (fr_add_u64(fr_now_ns(), delta, &deadline) < 0)
        return UINT64_MAX;
    return deadline;
}

int fr_ms_left(uint64_t deadline_ns)
{
    if (deadline_ns == UINT64_MAX)
        return -1;
    uint64_t now = fr_now_ns();
    if (now >= deadline_ns)
        return 0;
    uint64_t ms = (deadline_ns - now + 999999) / 1000000;
    return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

struct timespec fr_timespec_at(uint64_t deadline_ns)
{
    struct timespec ts;
    uint64_t sec = deadline_ns / FR_NS_PER_SEC;

    if (sec >= FR_FAR_FUTURE_SEC) {
        ts.tv_sec = (time_t)FR_FAR_FUTURE_SEC;
        ts.tv_nsec = 0;
        return ts;
    }
    ts.tv_sec = (time_t)sec;
    ts.tv_nsec = (long)(deadline_ns % FR_NS_PER_SEC);
    return ts;
}

int fr_cond_init_monotonic(pthread_cond_t *cond)
{
    pthread_condattr_t attr;
    int rc;

    if (cond == NULL)
        return FERRY_EINVAL;
    rc = pthread_condattr_init(&attr);
    if (rc != 0)
        return -rc;
    rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(cond, &attr);
    pthread_condattr_destroy(&attr);
    return -rc;
}
