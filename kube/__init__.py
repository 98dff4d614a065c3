"""sealgate on Kubernetes: identity by pod (`podwatch`: the API's pods told to the proxy's
source registry as address -> sandbox, by a label). docs/kubernetes.md."""
