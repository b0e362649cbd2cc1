"""The storage servers a job's data, code and checkpoints come from and its outputs go to,
each a real server (the protocol a client speaks to the cloud's) on 127.0.0.1, for the
tests and `just up --data`: S3 (moto), GCS (gcp-storage-emulator), Azure Blob (Azurite),
git (git daemon, git http-backend, sshd), files over http(s) and FTP (pyftpdlib)."""

from gpufleet_devstack.storage.azurite import AzureEndpoint, AzuriteBlob, running_azurite
from gpufleet_devstack.storage.ftp import FtpEndpoint, FtpServer, running_ftp
from gpufleet_devstack.storage.gcs import GcsEndpoint, GcsServer, running_gcs
from gpufleet_devstack.storage.git_daemon import GitDaemon, running_git_daemon
from gpufleet_devstack.storage.git_http import GitHttp, running_git_http
from gpufleet_devstack.storage.git_ssh import GitSsh, running_git_ssh
from gpufleet_devstack.storage.repos import bare_repo
from gpufleet_devstack.storage.s3 import S3Endpoint, S3Server, running_s3
from gpufleet_devstack.storage.tls import LocalTls, local_tls
from gpufleet_devstack.storage.web import WebServer, running_web

__all__ = [
    "AzureEndpoint",
    "AzuriteBlob",
    "FtpEndpoint",
    "FtpServer",
    "GcsEndpoint",
    "GcsServer",
    "GitDaemon",
    "GitHttp",
    "GitSsh",
    "LocalTls",
    "S3Endpoint",
    "S3Server",
    "WebServer",
    "bare_repo",
    "local_tls",
    "running_azurite",
    "running_ftp",
    "running_gcs",
    "running_git_daemon",
    "running_git_http",
    "running_git_ssh",
    "running_s3",
    "running_web",
]
