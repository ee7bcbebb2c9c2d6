"""Writing files that nobody sees half of and no other user can bend: the one helper through which clnet writes
(checkpoints, logs, plots, the tuning cache, ICD files).

Each folder on the way is opened from the one above it (openat) without following links, and every later step (the
temporary file, the rename) goes through the open folder, so nothing another user renames meanwhile changes where a
file lands. A link on the way is followed only where it lies in a folder nobody else can write. The folder written
in must belong to this user (or root) and be writable by nobody else, and so must each folder clnet makes. Root
passes every permission check the kernel makes, so these checks read owners and modes (fstat) instead of asking
whether a write would succeed.
"""
import errno
import os
import secrets
import stat

from .errors import Error

_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_LINK_HOPS = 40  # as the kernel's own limit on links in one lookup


class UnsafeFolder(Error, PermissionError):
    """A folder clnet would write in, or one on the way to it, could be changed by another user, who could then
    replace or redirect what clnet writes. `path` is the folder, `why` what is wrong with it."""

    def __init__(self, path, why):
        message = (f"clnet will not use the folder {path}: it {why}, so another user could replace or redirect the "
                   f"files clnet keeps there. {_fix(path, why)}")
        super().__init__(message)
        self.strerror = message  # handlers that print an OSError's strerror print this line
        self.path, self.why = path, why


def _fix(path, why):
    if "written by" in why:
        return f"Run `chmod go-w {path}`, or use a folder of your own."
    return "Use a folder of your own."


def trusted(st):
    """Whether a folder's owner is this user or root (the only users who may change a folder clnet trusts)."""
    return st.st_uid in (os.geteuid(), 0)


def check_folder(path, st, ancestor=False):
    """Raise UnsafeFolder unless st (an fstat of the folder PATH) is a folder of this user's or root's that nobody
    else can write. An ANCESTOR may be world-writable with the sticky bit (/tmp): there nobody can rename or remove
    an entry they do not own, and each entry on the way is checked in turn."""
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFolder(path, "is not a directory (a link or a file stands there)")
    if not trusted(st):
        raise UnsafeFolder(path, f"belongs to user id {st.st_uid}, neither to you ({os.geteuid()}) nor to root")
    if st.st_mode & 0o022 and not (ancestor and st.st_mode & stat.S_ISVTX):
        who = "others" if st.st_mode & 0o002 else "its group"
        raise UnsafeFolder(path, f"can be written by {who} (mode {stat.S_IMODE(st.st_mode):o})")


def _writable_by_others(st):
    return not trusted(st) or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX)


def _absolute(path):
    """PATH from the working folder if relative; not normalised: "link/.." is the link target's parent, as the kernel
    reads it, not the link's folder."""
    path = os.fspath(path)
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)


def open_folder(folder, create=False, mode=0o755, every_ancestor=False):
    """(fd, path): FOLDER opened without a link another user could have planted, and its path with every link
    resolved. Missing folders are made (create) with MODE, less the umask; the folder itself and each one made are
    checked (check_folder), and with every_ancestor each folder on the way too, so that the returned path, resolved
    again later by someone else (the OpenCL loader), leads to the same place. The caller closes fd."""
    pending = [p for p in _absolute(folder).split(os.sep) if p]
    fd, path, hops = os.open("/", _FOLDER), "/", 0
    stack = []  # (fd, path) of the folders above the current one, for ".."
    try:
        if every_ancestor:
            check_folder(path, os.fstat(fd), ancestor=bool(pending))
        while pending:
            name = pending.pop(0)
            if name == ".":
                continue
            if name == "..":
                if stack:
                    os.close(fd)
                    fd, path = stack.pop()
                continue
            here = os.path.join(path, name)
            made = False
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, mode, dir_fd=fd)
                    made = True
                except FileExistsError:  # another process made it meanwhile: checked below as any other
                    pass
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                holder = os.fstat(fd)
                # a link is as trustworthy as the folder it lies in (and, in a sticky folder, as its owner)
                if _writable_by_others(holder) or (holder.st_mode & stat.S_ISVTX and not trusted(st)):
                    raise UnsafeFolder(here, "is a link in a folder others can write")
                hops += 1
                if hops > _LINK_HOPS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), here)
                target = os.readlink(name, dir_fd=fd)
                pending[:0] = [p for p in target.split(os.sep) if p]
                if target.startswith(os.sep):
                    top = os.open("/", _FOLDER)
                    for up, _ in stack:
                        os.close(up)
                    os.close(fd)
                    stack, fd, path = [], top, "/"
                continue
            if not stat.S_ISDIR(st.st_mode):  # nothing can be made below a file: not a matter of trust
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), here)
            try:
                child = os.open(name, _FOLDER, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):  # a link or a file put there since the stat
                    raise UnsafeFolder(here, "is not a directory (a link or a file stands there)") from None
                raise
            stack.append((fd, path))
            fd, path = child, here
            if pending and (made or every_ancestor):  # (the last one is checked below in any case)
                check_folder(path, os.fstat(fd), ancestor=True)
        check_folder(path, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    finally:
        for up, _ in stack:
            os.close(up)
    return fd, path


def check_writable(path):
    """Raise what write_atomically(PATH) would for its folder (UnsafeFolder, or the OSError of a folder that cannot
    be made or written in), before any work is spent on what to write; PATH itself is left alone (an empty file is
    made beside it and removed)."""
    folder, name = os.path.split(_absolute(path))
    fd, folder = open_folder(folder, create=True)
    try:
        probe = f".{name}.{secrets.token_hex(6)}.tmp"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=fd))
        os.unlink(probe, dir_fd=fd)
    finally:
        os.close(fd)


def write_atomically(path, write, text=False, mode=0o666):
    """Call write(file) on a new file beside PATH, flush it to disk, then rename it over PATH: a reader sees the old
    file or the new one, and on any failure PATH is untouched. Writers running at once never share a temporary
    file (each gets its own name). The folder is made if missing and must be safe to write in (open_folder). A new
    file gets MODE less the umask, as open() gives; a file that is replaced keeps its mode. UnsafeFolder (an
    OSError) for a folder another user could change."""
    path = os.fspath(path)
    folder, name = os.path.split(_absolute(path))
    if not name:
        raise IsADirectoryError(errno.EISDIR, "a file name is needed, not a folder", path)
    fd, folder = open_folder(folder, create=True)
    try:
        try:
            old = os.stat(name, dir_fd=fd, follow_symlinks=False)
            keep = stat.S_IMODE(old.st_mode) & 0o777 if stat.S_ISREG(old.st_mode) else None
        except FileNotFoundError:
            keep = None
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        for _ in range(100):
            tmp = f".{name}.{secrets.token_hex(6)}.tmp"
            try:
                out = os.open(tmp, flags, mode if keep is None else keep, dir_fd=fd)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(errno.EEXIST, f"no free temporary name beside {path}")
        try:
            try:
                if keep is not None:  # the umask applied at creation; the old file's mode is what its owner chose
                    os.fchmod(out, keep)
                f = os.fdopen(out, "w" if text else "wb")
            except BaseException:
                os.close(out)
                raise
            with f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
                written, there = os.fstat(f.fileno()), os.stat(tmp, dir_fd=fd, follow_symlinks=False)
            if (written.st_dev, written.st_ino) != (there.st_dev, there.st_ino):  # never rename what someone put there
                raise UnsafeFolder(folder, f"had the temporary file {tmp} replaced while clnet wrote it")
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=fd)  # (a link someone put in its place is removed, not followed)
            except FileNotFoundError:
                pass
            raise
        try:
            os.fsync(fd)  # the rename itself reaches the disk
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOTSUP):  # a file system that cannot sync a folder: nothing to do
                raise
    finally:
        os.close(fd)
