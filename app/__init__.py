"""attnscope's web side: settings, schemas, routes and the app factory."""
