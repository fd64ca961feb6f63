/*
 * sd.h — kilnd's systemd integration, spoken directly: the notify protocol
 * (READY=1, STATUS=..., STOPPING=1, WATCHDOG=1), the watchdog interval,
 * socket activation (LISTEN_PID/LISTEN_FDS/LISTEN_FDNAMES), and the peer
 * credential checks the admin ops use.
 *
 * kilnd does not link libsystemd, by choice: the notify protocol is one
 * datagram to $NOTIFY_SOCKET and socket activation is three environment
 * variables, so doing it here keeps kilnd building, and behaving, the same on
 * a machine without libsystemd (the meson option `systemd` only reports
 * whether the library exists). When kilnd does not run under systemd every
 * call here is a cheap no-op.
 *
 * Threads: kilnd_sd_listen_fds() changes the environment (unsetenv), so it
 * runs on the main thread at start-up, before any other thread exists. The
 * other functions only read the environment and may be called from any
 * thread afterwards; kilnd_sd_notify() does no stdio and allocates nothing.
 */
#ifndef KILND_SD_H
#define KILND_SD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The first fd passed by socket activation (SD_LISTEN_FDS_START). */
#define KILND_SD_LISTEN_FDS_START 3

/* The longest fd name systemd allows (FileDescriptorName=, FDNAME_MAX). */
#define KILND_SD_FDNAME_MAX 255

/*
 * Sends `state` — newline-separated KEY=VALUE pairs, e.g.
 * "READY=1\nSTATUS=serving" — as one datagram to $NOTIFY_SOCKET: a file
 * system path, or the abstract namespace when it starts with '@'.
 * Returns 0 without doing anything when NOTIFY_SOCKET is unset or empty;
 * otherwise 0 when the datagram went out, or -errno (-EAFNOSUPPORT for an
 * address that is neither a path nor '@', -ENAMETOOLONG when it does not fit
 * a sockaddr_un, -EINVAL for a NULL state).
 */
int kilnd_sd_notify(const char *state);

/* kilnd_sd_notify() of a printf-formatted state. Returns the same codes,
 * or -ENOMEM when a state longer than 1 KiB cannot be allocated. */
int kilnd_sd_notifyf(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

/*
 * The watchdog interval systemd expects WATCHDOG=1 within, in microseconds:
 * $WATCHDOG_USEC when $WATCHDOG_PID is unset or names this process, else 0
 * (also 0 when WATCHDOG_USEC is unset, empty, zero or not a number).
 * Ping every half of it. The environment is left as it is.
 */
uint64_t kilnd_sd_watchdog_usec(void);

/* What an inherited fd is, from SO_DOMAIN/SO_TYPE/SO_PROTOCOL. */
typedef enum {
	KILND_SD_FD_OTHER = 0,	 /* not a socket, or another kind of socket */
	KILND_SD_FD_UNIX_STREAM, /* AF_UNIX, SOCK_STREAM */
	KILND_SD_FD_TCP_STREAM	 /* AF_INET or AF_INET6, SOCK_STREAM, TCP */
} kilnd_sd_fd_kind_t;

typedef struct kilnd_sd_fd {
	int fd;			 /* 3, 4, ... (close-on-exec is set) */
	kilnd_sd_fd_kind_t kind; /* see above */
	int domain;	/* SO_DOMAIN (AF_UNIX, ...); -1: not a socket */
	int type;	/* SO_TYPE (SOCK_STREAM, ...); -1: not a socket */
	bool listening; /* SO_ACCEPTCONN: listen() was called */
	char name[KILND_SD_FDNAME_MAX + 1]; /* from LISTEN_FDNAMES, or
					       "unknown" when it is unset */
} kilnd_sd_fd_t;

/*
 * Socket activation. When $LISTEN_PID equals getpid() and $LISTEN_FDS is
 * N > 0, reports the N fds starting at 3 in *fds (a malloc'd array the
 * caller frees with free(); the fds themselves now belong to the caller) and
 * *n = N, after setting FD_CLOEXEC on each. Names come from $LISTEN_FDNAMES
 * (colon-separated, one per fd; empty names stay empty); without it every
 * name is "unknown", as with sd_listen_fds_with_names().
 *
 * When the process was not activated (no LISTEN_PID, or another process's)
 * returns 0 with *fds = NULL and *n = 0. Errors: -EINVAL for a malformed
 * variable, a name count that differs from N or a name longer than 255
 * bytes; -EBADF (or another -errno) when one of the fds is not open;
 * -ENOMEM. On error *fds = NULL and *n = 0, and the fds are left alone.
 *
 * In every case LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES are unset before
 * it returns, so that no child process inherits them (sd_listen_fds(1)).
 * Main thread, at start-up only (see the top of this file).
 */
int kilnd_sd_listen_fds(kilnd_sd_fd_t **fds, size_t *n);

/*
 * The credentials of the process at the other end of the connected Unix
 * socket fd, as they were when it connected (SO_PEERCRED). Any out pointer
 * may be NULL. Returns 0 or -errno (-ENOTSOCK, -ENOTCONN, ...).
 */
int kilnd_peer_cred(int fd, pid_t *pid, uid_t *uid, gid_t *gid);

/*
 * True when the group named `group` exists and either its gid is
 * `primary_gid` (the peer's gid from SO_PEERCRED) or the user `uid` (looked
 * up in the password database) is a member of it (getgrouplist: its passwd
 * primary group or a supplementary group). False for NULL or "", for a
 * group or user that does not resolve, and on lookup errors.
 * Thread-safe (getgrnam_r, getpwuid_r); may block on NSS (e.g. LDAP), so
 * not for the loop thread when the group database is remote.
 */
bool kilnd_uid_in_group(uid_t uid, gid_t primary_gid, const char *group);

#endif /* KILND_SD_H */
