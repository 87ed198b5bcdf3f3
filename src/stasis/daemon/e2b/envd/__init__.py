"""envd's Connect RPC messages and service stubs (``process.Process``, ``filesystem.Filesystem``).

Generated code, copied unchanged from the ``e2b`` SDK 2.63.0 on PyPI (MIT licence), which generated it from
the protos in github.com/e2b-dev/E2B ``spec/envd`` with protoc-gen-py 0.6.0 and protoc-gen-connectrpc-py
0.12.1. Copied rather than imported: the daemon serves envd and must not depend on the client SDK;
copied rather than generated at install time: the generators are not Python packages.
"""
