/* ferry_strerror: one static text per FERRY_E* code. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"

static const char *fr_errno_text(int code)
{
    switch (code) {
    case 0:                  return "success";
    case FERRY_EINVAL:       return "invalid argument or malformed input";
    case FERRY_ENOMEM:       return "out of memory";
    case FERRY_EAGAIN:       return "resource temporarily unavailable: would block";
    case FERRY_EBUSY:        return "resource busy: pinned by an in-flight or unknown-outcome transfer";
    case FERRY_ETIMEDOUT:    return "timed out: deadline passed";
    case FERRY_ENOENT:       return "no such object, key, peer or region";
    case FERRY_EEXIST:       return "already exists";
    case FERRY_ENOSPC:       return "no space left";
    case FERRY_EACCES:       return "access refused: wrong remote key or access not allowed";
    case FERRY_EFAULT:       return "address outside a registered region";
    case FERRY_ECONNRESET:   return "connection to peer lost";
    case FERRY_ECONNREFUSED: return "connection refused: peer not listening";
    case FERRY_EIO:          return "input/output error";
    case FERRY_EPROTO:       return "protocol error: violation or corrupt frame";
    case FERRY_EMSGSIZE:     return "message too large: exceeds a hard limit";
    case FERRY_ERANGE:       return "value out of range or arithmetic overflow";
    case FERRY_ESTALE:       return "stale: descriptor belongs to a previous instance of the peer";
    case FERRY_ENOTSUP:      return "operation not supported by this build or transport";
    case FERRY_ECANCELED:    return "operation cancelled";
    case FERRY_EUNREACH:     return "node unreachable: its objects are kept until it is back or declared dead";
    default:                 return NULL;
    }
}

static const char *fr_ferry_text(int code)
{
    switch (code) {
    case FERRY_EAUTH:    return "authentication with the cluster token failed";
    case FERRY_EFENCED:  return "peer fenced: a transfer to it has an unknown outcome";
    case FERRY_ECORRUPT: return "data corrupt: checksum mismatch";
    case FERRY_ESTATE:   return "call not valid in the object's current state";
    case FERRY_ELOST:    return "object lost: every replica is gone";
    case FERRY_EREBUILD: return "partial apply: parameters must be rebuilt";
    default:             return NULL;
    }
}

const char *ferry_strerror(int code)
{
    /* Unknown codes are formatted per thread so concurrent callers never see
     * each other's text and the result stays valid until this thread's next
     * unknown-code call. */
    static _Thread_local char unknown[40];
    const char *text = fr_errno_text(code);

    if (text != NULL)
        return text;
    text = fr_ferry_text(code);
    if (text != NULL)
        return text;
    snprintf(unknown, sizeof(unknown), "unknown error %d", code);
    return unknown;
}

int fr_fail(ferry_error *err, int code, const char *fmt, ...)
{
    if (err) {
        char msg[sizeof err->msg];   /* the arguments may be err->msg itself */
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        memcpy(err->msg, msg, sizeof msg);
        err->code = code;
    }
    return code;
}

const char *fr_why(const ferry_error *err, int rc)
{
    if (!err)
        return "";
    return err->code == rc && err->msg[0] ? err->msg : ferry_strerror(rc);
}

bool fr_all_zero(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return false;
    return true;
}
