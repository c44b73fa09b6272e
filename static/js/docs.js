// Swagger UI for /openapi.json, served from the installed swagger-ui-bundle package.
window.SwaggerUIBundle({ url: "/openapi.json", dom_id: "#swagger-ui", deepLinking: true });
