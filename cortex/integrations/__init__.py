"""cortex inside agent frameworks: session backends for Google ADK and the OpenAI Agents SDK.

Each adapter lives in its own module and imports its framework there, so
``import cortex`` (and this package) needs neither framework installed:

- :mod:`cortex.integrations.adk`: ``CortexSessionService``, a Google ADK
  ``BaseSessionService`` (extra ``cortex-sessions[adk]``);
- :mod:`cortex.integrations.openai_agents`: ``CortexSession``, an OpenAI
  Agents SDK ``Session`` (extra ``cortex-sessions[openai-agents]``).
"""

__all__: list[str] = []
