"""Writing files so that nobody ever sees half of one: the one atomic-write helper (checkpoints, logs, plots, the
tuning cache, ICD files)."""
import os
import tempfile


def write_atomically(path, write, text=False, mode=0o644):
    """Call write(file) on a new file beside PATH, flush it to disk, then rename it over PATH: a reader sees the old
    file or the new one, and on any failure PATH is untouched. Writers running at once never share a temporary
    file (each gets its own name)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w" if text else "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
