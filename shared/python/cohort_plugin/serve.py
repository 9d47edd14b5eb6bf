"""go-plugin's server side, for a cohort trainer written in Python.

serve() is a plugin's whole main, as Go's plugin.Serve is: it keeps the
handshake line alone on stdout, logs hclog JSON to stderr (the host re-logs
it under the plugin's name), exits with its host, refuses to run when no
cohort host started it, negotiates the cohort plugin protocol, and serves
the Trainer service over gRPC on a Unix socket with mutual TLS (go-plugin's
AutoMTLS: the host's certificate comes in PLUGIN_CLIENT_CERT, this side's
goes back in the handshake line), beside go-plugin's health, controller and
stdio services. The Trainer service itself is service.py's.
"""

import base64
import concurrent.futures
import ctypes
import datetime
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time

import grpc

from . import service
from ._pb import trainer_pb2_grpc

# The handshake every cohort plugin and host share (Go: plugin.Handshake).
MAGIC_COOKIE_KEY = "COHORT_PLUGIN_MAGIC_COOKIE"
MAGIC_COOKIE_VALUE = "7c1d9e4a2f6b08e5d3a1c47b9f20e6d85a3c1b7e"
# The cohort plugin protocol versions a Python trainer speaks (Go:
# plugin.Protocols); 3 adds LoadCheckpoint's reason, 4 merged batch reports.
PROTOCOLS = (1, 2, 3, 4)
CORE_PROTOCOL_VERSION = 1  # go-plugin's own
MAX_MESSAGE_BYTES = 64 << 20  # Go: plugin.MaxMessageBytes
LOG_LEVEL_ENV = "COHORT_LOG_LEVEL"
# Where a launcher hands over this process's TLS certificate and key (PEM,
# one after the other) on an inherited pipe, so the SDK needs no X.509 code.
TLS_FD_ENV = "COHORT_PLUGIN_TLS_FD"

_LEVELS = {"trace": 5, "debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
           "error": logging.ERROR, "off": logging.CRITICAL + 10}
_HCLOG = {5: "trace", logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warn",
          logging.ERROR: "error", logging.CRITICAL: "error"}


class _HclogJSON(logging.Handler):
    """Writes records as the hclog JSON lines go-plugin parses."""

    def __init__(self, stream):
        super().__init__()
        self.stream = stream

    def emit(self, record):
        line = {"@level": _HCLOG.get(record.levelno, "info"), "@message": record.getMessage(),
                "@module": record.name,
                "@timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat()}
        line.update(getattr(record, "kv", {}))
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        try:
            self.stream.write(json.dumps(line, default=str) + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass


def logger(name):
    """The plugin's logger: hclog JSON on stderr at $COHORT_LOG_LEVEL."""
    log = logging.getLogger(name)
    if not log.handlers:
        log.addHandler(_HclogJSON(sys.stderr))
        log.propagate = False
        raw = os.environ.get(LOG_LEVEL_ENV, "info").strip().lower()
        log.setLevel(_LEVELS.get(raw, logging.INFO))
        if raw and raw not in _LEVELS:
            log.warning("unknown log level; using info", extra={"kv": {"env": LOG_LEVEL_ENV, "value": raw}})
    return log


def _protect_stdout():
    """Moves the real stdout to a private descriptor and points fd 1 and
    sys.stdout at stderr, so nothing the user's code prints reaches the
    handshake stream."""
    sys.stdout.flush()
    private = os.dup(1)
    os.set_inheritable(private, False)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return private


# What the process removes before it exits, however it exits short of a
# SIGKILL: the socket file.
_cleanup = []


def _remove_files():
    for path in _cleanup:
        try:
            os.remove(path)
        except OSError:
            pass


def _die_with_parent(log):
    """Exits when the host does: the kernel's parent-death signal (SIGTERM,
    which serve handles by stopping and removing the socket; the host's
    SIGKILL would leave it), and a watcher for what the signal misses (it
    follows the host's thread, not its process)."""
    ppid = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != ppid:
        os._exit(1)

    def watch():
        while True:
            time.sleep(0.3)
            if os.getppid() != ppid:
                log.warning("host process is gone; exiting", extra={"kv": {"parent_pid": ppid}})
                _remove_files()
                os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def negotiate(offered, served=PROTOCOLS):
    """The newest version both sides speak; None when none is shared."""
    common = set(served)
    got = []
    for v in (offered or "").split(","):
        try:
            got.append(int(v.strip()))
        except ValueError:
            continue
    both = [v for v in got if v in common]
    return max(both) if both else None


def _server_cert():
    """This side's certificate and key, PEM: from the launcher's pipe when
    one was handed over, else made here (needs the cryptography package)."""
    fd = os.environ.pop(TLS_FD_ENV, None)
    if fd is not None:
        with os.fdopen(int(fd), "rb") as f:
            blob = f.read(1 << 16)
        end = b"-----END CERTIFICATE-----"
        cut = blob.index(end) + len(end)
        return blob[:cut] + b"\n", blob[cut:].lstrip()
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError as e:
        raise RuntimeError("mutual TLS needs a certificate: start the plugin through a launcher that hands one "
                           "over (%s) or install the cryptography package (%s)" % (TLS_FD_ENV, e)) from e
    key = ec.generate_private_key(ec.SECP521R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost"),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "cohort")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(seconds=30))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=True, key_agreement=True,
                                         key_cert_sign=True, content_commitment=False, data_encipherment=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(key, hashes.SHA512()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                              serialization.NoEncryption()))


def _pem_to_der(pem):
    body = b"".join(line for line in pem.strip().splitlines() if not line.startswith(b"-----"))
    return base64.b64decode(body)


def _plugin_services(stopped):
    """go-plugin's own services: health (what Client.Ping asks), the
    controller (Shutdown, on the host's Kill) and stdio (a stream that
    stays open and empty: stdout and stderr reach the host as the process's
    stderr)."""
    serving = b"\x08\x01"  # grpc.health.v1.HealthCheckResponse{status: SERVING}

    def health(_req, _ctx):
        return serving

    def shutdown(_req, _ctx):
        stopped.set()
        return b""

    def stdio(_req, ctx):
        while ctx.is_active() and not stopped.wait(1.0):
            pass
        return
        yield  # a generator: the stream ends with the server

    ident = lambda b: b  # noqa: E731 - messages pass as raw bytes
    return [
        grpc.method_handlers_generic_handler("grpc.health.v1.Health", {
            "Check": grpc.unary_unary_rpc_method_handler(health, ident, ident)}),
        grpc.method_handlers_generic_handler("plugin.GRPCController", {
            "Shutdown": grpc.unary_unary_rpc_method_handler(shutdown, ident, ident)}),
        grpc.method_handlers_generic_handler("plugin.GRPCStdio", {
            "StreamStdio": grpc.unary_stream_rpc_method_handler(stdio, ident, ident)}),
    ]


def serve(trainer_factory, name=None):
    """Runs a trainer plugin; it returns only by exiting the process.

    trainer_factory(log) builds the Trainer to serve (service.Trainer's
    methods) before the handshake; an exception there is logged and the
    process exits with status 1.
    """
    handshake = _protect_stdout()
    name = name or os.path.basename(sys.argv[0])
    log = logger(name)
    _die_with_parent(log)
    if os.environ.get(MAGIC_COOKIE_KEY) != MAGIC_COOKIE_VALUE:
        sys.stderr.write("%s is a cohort plugin; cohort starts it, it is not meant to be run directly.\n" % name)
        sys.exit(1)
    offered = os.environ.get("PLUGIN_PROTOCOL_VERSIONS", "")
    version = negotiate(offered)
    if version is None:
        # go-plugin's host names both sides' versions from this line.
        version = max(PROTOCOLS)
    try:
        impl = trainer_factory(log)
        if impl is None:
            raise RuntimeError("the factory returned no trainer")
        client_cert = os.environ.get("PLUGIN_CLIENT_CERT", "").encode()
        cert_pem, key_pem = _server_cert() if client_cert else (b"", b"")
    except Exception as e:  # noqa: BLE001 - any failure ends the start, said once
        log.error("plugin failed to start", extra={"kv": {"error": "%s: %s" % (type(e).__name__, e)}})
        sys.exit(1)

    stopped = threading.Event()
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="grpc"),
                         handlers=_plugin_services(stopped),
                         options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                  ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)])
    trainer_pb2_grpc.add_TrainerServicer_to_server(
        service.TrainerService(impl, log, load_reasons=version >= 3), server)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    sock_dir = os.environ.get("PLUGIN_UNIX_SOCKET_DIR") or tempfile.gettempdir()
    fd, path = tempfile.mkstemp(prefix="plugin", dir=sock_dir)
    os.close(fd)
    os.remove(path)
    _cleanup.append(path)
    addr = "unix:" + path
    if client_cert:
        creds = grpc.ssl_server_credentials([(key_pem, cert_pem)], root_certificates=client_cert,
                                            require_client_auth=True)
        server.add_secure_port(addr, creds)
        cert_field = base64.b64encode(_pem_to_der(cert_pem)).decode().rstrip("=")
    else:
        server.add_insecure_port(addr)
        cert_field = ""
    server.start()
    log.debug("serving", extra={"kv": {"kind": "trainer", "protocol": version}})
    os.write(handshake, ("%d|%d|unix|%s|grpc|%s\n" % (CORE_PROTOCOL_VERSION, version, path, cert_field)).encode())
    os.close(handshake)
    try:
        while not stopped.wait(0.5):
            pass
    finally:
        server.stop(1).wait(2)
        _remove_files()
    os._exit(0)
