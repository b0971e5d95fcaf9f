"""The swarm's wire: messages, control schemas, authentication, transport and WAN emulation."""
