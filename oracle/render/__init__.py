"""Renderers of a Report: the console (console), JUnit XML (junit), Markdown (markdown) and HTML
(html), written beside report.json by files; the verdict rules (verdict), findings and escaping are shared."""
