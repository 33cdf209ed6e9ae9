#!/usr/bin/env python3
"""Every relative link of the built book resolves: the page exists and, with a
#fragment, the page has an element with that id. Usage: check-book-links.py BOOK_DIR
(the HTML output of `mdbook build docs/book`, docs/book/book). Exits 1 naming every
broken link with the page it is on."""
import html.parser
import os
import sys
import urllib.parse


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []
        self.ids = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if value is None:
                continue
            if name == "id":
                self.ids.add(value)
            if (tag, name) in (("a", "href"), ("img", "src"), ("link", "href"), ("script", "src")):
                self.links.append(value)


def parse(path, cache={}):
    if path not in cache:
        page = Page()
        with open(path, encoding="utf-8") as f:
            page.feed(f.read())
        cache[path] = page
    return cache[path]


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "docs/book/book")
    if not os.path.isfile(os.path.join(root, "index.html")):
        sys.exit(f"{root}: no index.html (run mdbook build docs/book first)")
    broken, checked = [], 0
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            # print.html repeats every page with links rewritten to its own anchors, and
            # 404.html links through the site's absolute URL: both are mdBook's.
            if not name.endswith(".html") or name in ("print.html", "404.html", "toc.html"):
                continue
            page_path = os.path.join(folder, name)
            for link in parse(page_path).links:
                url = urllib.parse.urlsplit(link)
                if url.scheme or url.netloc or link.startswith("/"):
                    continue
                checked += 1
                target = page_path
                if url.path:
                    target = os.path.normpath(os.path.join(folder, urllib.parse.unquote(url.path)))
                    if os.path.isdir(target):
                        target = os.path.join(target, "index.html")
                where = os.path.relpath(page_path, root)
                if not os.path.exists(target):
                    broken.append(f"{where}: {link}: no such file")
                    continue
                if url.fragment and target.endswith(".html"):
                    if urllib.parse.unquote(url.fragment) not in parse(target).ids:
                        broken.append(f"{where}: {link}: no element with id {url.fragment!r}")
    for b in broken:
        print(f"broken link: {b}")
    print(f"{checked} relative links checked, {len(broken)} broken")
    sys.exit(1 if broken else 0)


main()
