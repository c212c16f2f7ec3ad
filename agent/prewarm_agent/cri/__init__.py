"""CRI image client for the node agent."""
