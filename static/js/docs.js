// Swagger UI for /openapi.json, served from the installed swagger-ui-bundle package; the page's
// own header and intro follow the reader's language (Swagger UI and the schema stay English).
import { initLanguage } from "./i18n.js";

initLanguage();
window.SwaggerUIBundle({ url: "/openapi.json", dom_id: "#swagger-ui", deepLinking: true });
