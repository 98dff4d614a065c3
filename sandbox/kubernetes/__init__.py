"""sandboxd on Kubernetes: its sandboxes Agent Sandbox claims, driven through the exec API."""
