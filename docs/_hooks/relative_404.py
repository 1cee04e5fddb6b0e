"""MkDocs hook: the 404 page's links relative to the site's root, where it lies, so that they work in a site opened
from disk (file://) as in one served from a domain's root. MkDocs writes them root-absolute (`/index.html`,
`/assets/...`) when there is no `site_url`, and the site has none: it is built to be opened from anywhere."""

from __future__ import annotations

import re

# href="/...", src="/...", and the theme's JSON settings "base": "/", "search": "/assets/..."
ROOTED = re.compile(r'((?:href|src)=|"(?:base|search)": )"/(?!/)')


def relative(html: str) -> str:
    """Every root-absolute link of a page at the site's root, relative to it ("/" itself becomes ".")."""
    return ROOTED.sub(lambda m: m.group(1) + '"', html.replace('="/"', '="./"').replace('"base": "/"', '"base": "."'))


def on_post_template(output_content: str, template_name: str, config) -> str:
    return relative(output_content) if template_name == "404.html" else output_content
