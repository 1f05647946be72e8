"""A real Kubernetes control plane for the tests, built from upstream (``hack/kube``).

:mod:`.pki` makes the certificates, :mod:`.controlplane` starts and stops etcd, the API server,
the controller manager, the scheduler and kwok on 127.0.0.1, :mod:`.client` is the plain client
the tests act through (as admin or as any identity), and :mod:`.audit` reads the audit log.
"""
