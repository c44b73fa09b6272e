"""attnscope's model side: loading, hooks, the activation cache and analysis.

Nothing here knows about HTTP; ``app/`` wraps it in a JSON API.
"""
