"""The operator side, `kubemoot-proxy candidates`: Kubernetes YAML in, candidate lists out.

Not part of the sidecar: `scheduling` is its pure filter -> score -> bind, `candidates` the
shell that reads the documents and prints the result.
"""
