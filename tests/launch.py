"""The commands the tests start (`python -m scripts.base_train ...`, `python -c CODE`, `python
script.py`), forked from a server that has already imported torch, instead of each starting a
fresh interpreter: a fresh one spends about 3.5 s importing torch and torch._dynamo before the
command's first line, and the suite starts a few hundred of them.

`run(argv, ...)` and `Popen(argv, ...)` take what subprocess.run and subprocess.Popen take,
for an argv whose program is this interpreter. The child is a real process of its own (own pid,
own signals, own exit status, its atexit handlers run); what it shares with a fresh one is all
that matters to a command: argv, the working directory, the environment, and stdin, stdout and
stderr, given to it as file descriptors. Only modules that read nothing of the environment
that tests change are preloaded; a command whose environment differs from the server's in what
torch, Triton or OpenMP read when imported (TRITON_INTERPRET, ATEN_CPU_CAPABILITY, ...) gets a
fresh interpreter, as does any argv that is not this interpreter's.

Built on multiprocessing's forkserver (the standard library's server of pre-imported forks,
which also passes file descriptors to its children); what is ours is only the child's side:
becoming the command.
"""

import atexit
import io
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import threading
import traceback
from multiprocessing import reduction, spawn

PRELOAD = ["torch", "numpy", "torch._dynamo"]
# What the preloaded modules read from the environment when imported: a command that sets any
# of these otherwise than the server had them must not inherit the server's imports.
# (PYTHONPATH and PYTHONUNBUFFERED are the child's own: see _fresh_path and _become.)
IMPORT_TIME_PREFIXES = ("TORCH", "PYTORCH", "TRITON", "ATEN_", "OMP_", "MKL_", "KMP_", "CUDA_", "NVIDIA_",
                        "PYTHON", "LD_")
OWN = ("PYTHONPATH", "PYTHONUNBUFFERED")
PIPE, STDOUT, DEVNULL = subprocess.PIPE, subprocess.STDOUT, subprocess.DEVNULL

_context = None
_server_env = None
_paths = {}


# The server's environment is the test process's without what conftest.py sets for the kernel
# tests that run in the test process itself (Triton's interpreter): the commands the tests start
# run as a user's do, without it (tests/test_train_e2e.py env_for), so that is what most of them
# share with the server.
SERVER_WITHOUT = ("TRITON_INTERPRET",)


def _forkserver():
    """The forkserver context, its server started (lazily, once per test process) with this
    process's environment at that time, less SERVER_WITHOUT."""
    global _context, _server_env
    if _context is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        kept = {name: os.environ.pop(name) for name in SERVER_WITHOUT if name in os.environ}
        try:
            from multiprocessing import forkserver
            forkserver.ensure_running()
            _server_env = _import_time_env(os.environ)
        finally:
            os.environ.update(kept)
        _context = context
    return _context


def _import_time_env(env):
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES) and k not in OWN}


def forkable(argv, env):
    """Whether `argv` (under `env`) can be forked from the server: this interpreter running a
    module (-m), code (-c or - for stdin) or a script, with the server's import-time environment."""
    if not argv or argv[0] != sys.executable or len(argv) < 2 or (argv[1].startswith("-") and argv[1] not in
                                                                   ("-m", "-c", "-")):
        return False
    if os.environ.get("NANOCHAT_TEST_FORK", "1") == "0":
        return False
    _forkserver()
    return _import_time_env(env if env is not None else os.environ) == _server_env


def _fresh_path(env):
    """sys.path past its first entry as a fresh interpreter has it under `env` (PYTHONPATH, then
    the standard library and site-packages), not the test process's, which pytest extended."""
    key = env.get("PYTHONPATH")
    if key not in _paths:
        out = subprocess.run([sys.executable, "-c", "import sys, json; print(json.dumps(sys.path[1:]))"],
                             env=env, capture_output=True, text=True, check=True).stdout
        import json
        _paths[key] = json.loads(out)
    return _paths[key]


class _Fd:
    """A file descriptor handed to the forked child: multiprocessing passes it over the server's
    socket when the process is started (reduction.DupFd must be called while pickling)."""

    def __init__(self, fd):
        self.fd = fd

    def __reduce__(self):
        return _received, (reduction.DupFd(self.fd),)


def _received(dup):
    return dup


def _become(argv, cwd, env, fds, path, umask):
    """In the forked child: take the command's stdio, working directory, environment and argv,
    and run it as `python argv...` would, ending with its exit status."""
    for target, fd in zip((0, 1, 2), fds):
        fd = fd.detach()
        os.dup2(fd, target)
        if fd > 2 and fd not in fds:
            os.close(fd)
    os.umask(umask)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    buffered = not env.get("PYTHONUNBUFFERED")
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=buffered, write_through=not buffered)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True, write_through=True)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if "OMP_NUM_THREADS" in env:
        import torch
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    option, rest = argv[1], argv[2:]
    status, interrupted = 0, False
    try:
        if option == "-m":
            sys.argv = [rest[0], *rest[1:]]
            sys.path[:] = [os.getcwd(), *path]
            runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
        elif option in ("-c", "-"):
            code, sys.argv = (rest[0], ["-c", *rest[1:]]) if option == "-c" else (sys.stdin.read(), ["-", *rest])
            sys.path[:] = ["", *path]
            exec(compile(code, "<string>" if option == "-c" else "<stdin>", "exec"),
                 {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            sys.argv = argv[1:]
            sys.path[:] = [os.path.dirname(os.path.abspath(option)), *path]
            runpy.run_path(option, run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            status = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            status = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:
        traceback.print_exc()
        status = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        if interrupted:  # as Python does: die of the signal, so the parent sees -SIGINT
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(status)


def _start_without_main(process):
    """Start `process` without the test process's __main__: multiprocessing would otherwise run
    it again in the child (pytest's, or a script's) before the command."""
    real = spawn.get_preparation_data

    def without_main(name):
        data = real(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    spawn.get_preparation_data = without_main
    try:
        process.start()
    finally:
        spawn.get_preparation_data = real


class Popen:
    """subprocess.Popen for this interpreter's commands, forked from the server (or, where
    `forkable` says no, a subprocess.Popen)."""

    TAKES = {"cwd", "env", "stdin", "stdout", "stderr", "text", "universal_newlines", "encoding", "errors"}

    def __new__(cls, argv, **kwargs):
        if set(kwargs) - cls.TAKES or not forkable(list(argv), kwargs.get("env")):
            return subprocess.Popen(argv, **kwargs)
        return super().__new__(cls)

    def __init__(self, argv, *, cwd=None, env=None, stdin=None, stdout=None, stderr=None, text=False,
                 universal_newlines=None, encoding=None, errors=None):
        self.args = list(argv)
        self.returncode = None
        text = bool(text or universal_newlines or encoding or errors)
        ours, theirs = [], []
        self.stdin = self.stdout = self.stderr = None

        def child_end(spec, index, mode):
            if spec is None:
                return index
            if spec == DEVNULL:
                fd = os.open(os.devnull, os.O_RDWR)
                ours.append(fd)
                return fd
            if spec == PIPE:
                r, w = os.pipe()
                mine, child = (w, r) if index == 0 else (r, w)
                theirs.append(mine)
                ours.append(child)
                stream = os.fdopen(mine, mode + ("" if text else "b"), encoding=encoding if text else None,
                                   errors=errors if text else None)
                setattr(self, ("stdin", "stdout", "stderr")[index], stream)
                return child
            return spec if isinstance(spec, int) else spec.fileno()

        fds = [child_end(stdin, 0, "w"), child_end(stdout, 1, "r")]
        fds.append(fds[1] if stderr == STDOUT else child_end(stderr, 2, "r"))
        env = dict(os.environ if env is None else env)
        umask = os.umask(0)
        os.umask(umask)
        context = _forkserver()
        self._process = context.Process(target=_become, daemon=False, args=(
            self.args, os.path.abspath(cwd or os.getcwd()), env, [_Fd(fd) for fd in fds], _fresh_path(env), umask))
        try:
            _start_without_main(self._process)
        finally:
            for fd in ours:
                os.close(fd)
        # Like a subprocess.Popen it is not joined when the test process exits (multiprocessing
        # would wait there for a command a test left running).
        multiprocessing.process._children.discard(self._process)
        self.pid = self._process.pid

    def poll(self):
        if self.returncode is None and self._process.exitcode is not None:
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout=None):
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, input=None, timeout=None):
        results = {}

        def drain(name):
            stream = getattr(self, name)
            results[name] = stream.read()
            stream.close()

        readers = [threading.Thread(target=drain, args=(name,), daemon=True)
                   for name in ("stdout", "stderr") if getattr(self, name) is not None]
        for reader in readers:
            reader.start()
        if self.stdin is not None:
            if input:
                self.stdin.write(input)
            self.stdin.close()
        self.wait(timeout)
        for reader in readers:
            reader.join()
        return results.get("stdout"), results.get("stderr")

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for stream in (self.stdout, self.stderr, self.stdin):
            if stream is not None:
                stream.close()
        self.wait()


def run(argv, *, input=None, capture_output=False, timeout=None, check=False, **kwargs):
    """subprocess.run for this interpreter's commands (see Popen)."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = PIPE
    if input is not None:
        kwargs["stdin"] = PIPE
    with Popen(argv, **kwargs) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        result.check_returncode()
    return result


# ---- `python` on a shell's PATH (tests/bin/python): for the tests that run speedrun.sh's shell
# functions, whose commands call `python` by name. The shim sends its argv, working directory,
# environment and stdio to a server thread of the test process, which starts the command with
# Popen above, passes on the signals the shim receives, and returns the exit status.
BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")
_socket_path = None


def shell_env(env):
    """`env` with tests/bin first on PATH and the address of this process's server, so that a
    shell started with it runs `python ...` forked from the server."""
    global _socket_path
    if _socket_path is None:
        import socket
        import tempfile
        _socket_path = os.path.join(tempfile.mkdtemp(prefix="nanochat_launch_"), "socket")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(_socket_path)
        server.listen(16)
        threading.Thread(target=_serve, args=(server,), daemon=True).start()
    env = dict(env)
    env["PATH"] = os.pathsep.join([BIN, os.path.dirname(sys.executable), env.get("PATH", "")])
    env.update(NANOCHAT_TEST_LAUNCHER=_socket_path, NANOCHAT_TEST_PYTHON=sys.executable)
    return env


def _serve(server):
    while True:
        conn, _ = server.accept()
        threading.Thread(target=_serve_one, args=(conn,), daemon=True).start()


def _serve_one(conn):
    import json
    import socket
    with conn:
        header, fds, _, _ = socket.recv_fds(conn, 8, 3)
        size, payload = int.from_bytes(header, "big"), b""
        while len(payload) < size:
            payload += conn.recv(size - len(payload))
        request = json.loads(payload)
        try:
            proc = Popen([sys.executable, *request["args"]], cwd=request["cwd"], env=request["env"],
                         stdin=fds[0], stdout=fds[1], stderr=fds[2])
        finally:
            for fd in fds:
                os.close(fd)
        conn.sendall(json.dumps({"pid": proc.pid}).encode() + b"\n")

        def pass_signals():
            for line in conn.makefile("r"):
                try:
                    proc.send_signal(int(line))
                except (ProcessLookupError, ValueError):
                    pass

        threading.Thread(target=pass_signals, daemon=True).start()
        conn.sendall(json.dumps({"status": proc.wait()}).encode() + b"\n")
