/* jansson wrappers: parse with located messages, canonical dump, atomic
 * write, typed getters. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"

/* Duplicate keys make a document mean different things to different
 * readers; refuse them. */
#define FR_JSON_LOAD_FLAGS JSON_REJECT_DUPLICATES

static void fr_set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void fr_set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int fr_json_parse(const char *text, size_t len, json_t **out, char *err, size_t errlen)
{
    json_error_t jerr;

    if (out == NULL || (text == NULL && len > 0)) {
        fr_set_err(err, errlen, "invalid argument");
        return FERRY_EINVAL;
    }
    *out = json_loadb(text != NULL ? text : "", len, FR_JSON_LOAD_FLAGS, &jerr);
    if (*out == NULL) {
        fr_set_err(err, errlen, "<input>:%d:%d: %s", jerr.line, jerr.column, jerr.text);
        return FERRY_EINVAL;
    }
    return 0;
}

/* Opening the file ourselves keeps errno, so a missing file reads as
 * FERRY_ENOENT rather than as malformed JSON. */
int fr_json_load_file(const char *path, json_t **out, char *err, size_t errlen)
{
    json_error_t jerr;

    if (path == NULL || out == NULL) {
        fr_set_err(err, errlen, "invalid argument");
        return FERRY_EINVAL;
    }
    *out = NULL;
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        int rc = -errno;
        fr_set_err(err, errlen, "%s: %s", path, strerror(-rc));
        return rc;
    }
    *out = json_loadf(f, FR_JSON_LOAD_FLAGS, &jerr);
    int read_failed = ferror(f);
    fclose(f);
    if (*out != NULL)
        return 0;
    fr_set_err(err, errlen, "%s:%d:%d: %s", path, jerr.line, jerr.column, jerr.text);
    return read_failed ? FERRY_EIO : FERRY_EINVAL;
}

char *fr_json_dump_canonical(const json_t *j)
{
    if (j == NULL)
        return NULL;
    return json_dumps(j, JSON_SORT_KEYS | JSON_COMPACT | JSON_ENCODE_ANY);
}

static int fr_write_all_fd(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t w = write(fd, buf, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        buf += w;
        len -= (size_t)w;
    }
    return 0;
}

/* Writes text + '\n' to a fresh file and flushes it to disk. */
static int fr_write_synced(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    int rc = fr_write_all_fd(fd, text, strlen(text));
    if (rc == 0)
        rc = fr_write_all_fd(fd, "\n", 1);
    if (rc == 0 && fsync(fd) < 0)
        rc = -errno;
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    return rc;
}

/* The rename is only durable once the directory entry is; failure to sync
 * the directory is not reported since the data itself is safe. */
static void fr_sync_parent_dir(const char *path)
{
    char *dir = fr_strdup(path);
    if (dir == NULL)
        return;
    char *slash = strrchr(dir, '/');
    const char *name = ".";
    if (slash == dir)
        name = "/";
    else if (slash != NULL) {
        *slash = '\0';
        name = dir;
    }
    int fd = open(name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    fr_free(dir);
}

static char *fr_tmp_path(const char *path)
{
    char *tmp = NULL;

    if (asprintf(&tmp, "%s.tmp.%ld", path, (long)getpid()) < 0)
        return NULL;
    return tmp;
}

/* Readers see either the old file or the whole new one, never a torn one:
 * write PATH.tmp.PID, fsync, rename over PATH. */
int fr_json_write_file(const char *path, const json_t *j)
{
    if (path == NULL || j == NULL)
        return FERRY_EINVAL;
    char *text = fr_json_dump_canonical(j);
    char *tmp = fr_tmp_path(path);
    int rc = FERRY_ENOMEM;
    if (text == NULL || tmp == NULL)
        goto out;
    rc = fr_write_synced(tmp, text);
    if (rc == 0 && rename(tmp, path) < 0)
        rc = -errno;
    if (rc < 0)
        unlink(tmp);
    else
        fr_sync_parent_dir(path);
out:
    free(tmp);
    free(text);
    return rc;
}

/* Looks up key in obj; on failure fills err and returns NULL. */
static json_t *fr_json_member(const json_t *obj, const char *key, char *err, size_t errlen)
{
    if (!json_is_object(obj) || key == NULL) {
        fr_set_err(err, errlen, "'%s': not looked up in a JSON object", key ? key : "(null)");
        return NULL;
    }
    json_t *v = json_object_get(obj, key);
    if (v == NULL)
        fr_set_err(err, errlen, "'%s': missing", key);
    return v;
}

int fr_json_get_u64(const json_t *obj, const char *key, uint64_t *out, char *err, size_t errlen)
{
    json_t *v = fr_json_member(obj, key, err, errlen);

    if (v == NULL)
        return FERRY_EINVAL;
    if (!json_is_integer(v)) {
        fr_set_err(err, errlen, "'%s': expected an integer", key);
        return FERRY_EINVAL;
    }
    json_int_t i = json_integer_value(v);
    if (i < 0) {
        fr_set_err(err, errlen, "'%s': expected a non-negative integer, got %" JSON_INTEGER_FORMAT,
                   key, i);
        return FERRY_EINVAL;
    }
    if (out != NULL)
        *out = (uint64_t)i;
    return 0;
}

/* *out borrows the string from obj: valid while obj holds the member. */
int fr_json_get_str(const json_t *obj, const char *key, const char **out, char *err, size_t errlen)
{
    json_t *v = fr_json_member(obj, key, err, errlen);

    if (v == NULL)
        return FERRY_EINVAL;
    if (!json_is_string(v)) {
        fr_set_err(err, errlen, "'%s': expected a string", key);
        return FERRY_EINVAL;
    }
    if (out != NULL)
        *out = json_string_value(v);
    return 0;
}
