"""Generated workloads of `ferry lab`, made from the Django 5.1.1 / 5.1.2 trees that
lab/workloads.sh unpacked, byte for byte the same on every run.

  mbox-append  a ~20 MB mailbox, one message per Django source or doc file (every 7th with a
               base64 PNG from the docs attached); new = old + about 1.5 % more messages
  text-insert  ~12 MB of text (the docs' .txt files, then django/*.py); new = the same with the
               5.1.2 release notes (~2.6 KB) inserted after the first line break past 1 %
  docx-edit    a Word document (python-docx) of ~2 MB of text from docs/topics plus the docs'
               pictures; new = a paragraph inserted after the third, one word changed midway

Then every workload's times are set so that a file the same on both sides looks untouched
(2024-01-01) and a changed one newer (2024-02-01): registry archives carry fixed or build
times, which would let a size-and-time check skip changed files of the same size.

Usage: python generate.py WORKLOADS_DIR   (python-docx 1.1.2 importable)
"""

import base64
import filecmp
import io
import os
import sys
import zipfile

UNTOUCHED, CHANGED = 1704067200, 1706745600  # 2024-01-01, 2024-02-01 UTC


def files(root, extensions):
    """Paths under root with one of the extensions, in a fixed (sorted) order."""
    found = []
    for dirpath, dirnames, names in os.walk(root):
        dirnames.sort()
        found += [os.path.join(dirpath, n) for n in sorted(names)
                  if n.rsplit(".", 1)[-1] in extensions]
    return sorted(found)


def mail(n, path, tree, pictures):
    """Message n of the mailbox: the file at path as its body."""
    name = os.path.relpath(path, tree)
    text = open(path, "rb").read().decode("utf-8", "replace")
    text = "\n".join(">" + line if line.startswith("From ") else line
                     for line in text.split("\n"))
    day, second = divmod(n * 617, 86400)
    date = "Mon, %02d Jan 2024 %02d:%02d:%02d +0000" % (
        1 + day % 28, second // 3600, second // 60 % 60, second % 60)
    head = ("From patches@example.invalid Mon Jan  1 00:00:00 2024\n"
            "From: Dev %d <dev%d@example.invalid>\nTo: list@example.invalid\n"
            "Subject: [PATCH %d] %s\nDate: %s\nMessage-ID: <%d.wl@example.invalid>\n"
            "MIME-Version: 1.0\n" % (n % 97, n % 97, n, name, date, n))
    if n % 7 or not pictures:
        return (head + "Content-Type: text/plain; charset=utf-8\n\n" + text + "\n\n").encode()
    edge = "==wl-boundary-%d==" % n
    picture = base64.encodebytes(open(pictures[n // 7 % len(pictures)], "rb").read()).decode()
    return (head
            + 'Content-Type: multipart/mixed; boundary="%s"\n\n' % edge
            + "--%s\nContent-Type: text/plain; charset=utf-8\n\n%s\n" % (edge, text)
            + "--%s\nContent-Type: image/png\nContent-Transfer-Encoding: base64\n" % edge
            + 'Content-Disposition: attachment; filename="shot%d.png"\n\n' % n
            + "%s--%s--\n\n" % (picture, edge)).encode()


def mailbox(out, tree, pictures):
    sources = files(tree, {"txt", "py", "po"})
    messages, n = [], 0
    while sum(map(len, messages)) < 20_000_000:
        messages.append(mail(n, sources[n], tree, pictures))
        n += 1
    old = b"".join(messages)
    added = 0
    while added < 0.015 * len(old):
        messages.append(mail(n, sources[n], tree, pictures))
        added += len(messages[-1])
        n += 1
    write(out, "mbox-append", "inbox.mbox", old, b"".join(messages))


def book(out, tree, newer):
    parts, size = [], 0
    for path in files(os.path.join(tree, "docs"), {"txt"}) + files(os.path.join(tree, "django"), {"py"}):
        parts.append(b"==== " + os.path.relpath(path, tree).encode() + b"\n"
                     + open(path, "rb").read() + b"\n")
        size += len(parts[-1])
        if size > 12_000_000:
            break
    text = b"".join(parts)
    notes = open(os.path.join(newer, "docs/releases/5.1.2.txt"), "rb").read()
    at = text.index(b"\n", len(text) // 100) + 1
    write(out, "text-insert", "book.txt", text, text[:at] + notes + text[at:])


def document(out, tree, pictures):
    from docx import Document
    from docx.shared import Inches

    paragraphs = []
    for path in files(os.path.join(tree, "docs/topics"), {"txt"}):
        for block in open(path, encoding="utf-8").read().split("\n\n"):
            if block.strip():
                paragraphs.append(block.strip())
            if sum(map(len, paragraphs)) > 2_000_000:
                break
        if sum(map(len, paragraphs)) > 2_000_000:
            break
    # A picture after paragraph 200 of every 400; the pictures left over at the end.
    items = []
    for i, text in enumerate(paragraphs):
        items.append(("p", text))
        if i % 400 == 200 and i // 400 < len(pictures):
            items.append(("img", pictures[i // 400]))
    items += [("img", p) for p in pictures[(len(paragraphs) + 199) // 400:]]

    def save(edited):
        chosen = list(items)
        if edited:
            note = "EDITOR'S NOTE: this paragraph was inserted in revision 2 of the document. "
            chosen.insert(3, ("p", note * 4))
            k = len(chosen) // 2
            while chosen[k][0] != "p" or "the" not in chosen[k][1]:
                k += 1
            chosen[k] = ("p", chosen[k][1].replace("the", "THE", 1))
        doc = Document()
        doc.add_heading("Django topics (workload)", 0)
        for kind, value in chosen:
            if kind == "p":
                doc.add_paragraph(value)
            else:
                doc.add_picture(value, width=Inches(5))
        saved = io.BytesIO()
        doc.save(saved)
        # Zipped again with fixed times, so the bytes do not depend on the clock.
        src = zipfile.ZipFile(io.BytesIO(saved.getvalue()))
        out_zip = io.BytesIO()
        with zipfile.ZipFile(out_zip, "w", zipfile.ZIP_DEFLATED) as z:
            for member in src.infolist():
                info = zipfile.ZipInfo(member.filename, date_time=(2024, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, src.read(member.filename))
        return out_zip.getvalue()

    write(out, "docx-edit", "report.docx", save(False), save(True))


def write(out, workload, name, old, new):
    open(os.path.join(out, workload, "old", name), "wb").write(old)
    open(os.path.join(out, workload, "new", name), "wb").write(new)


def same(a, b):
    if os.path.islink(a) or os.path.islink(b):
        return os.path.islink(a) and os.path.islink(b) and os.readlink(a) == os.readlink(b)
    return os.path.isfile(b) and filecmp.cmp(a, b, shallow=False)


def set_times(out):
    for workload in sorted(os.listdir(out)):
        old, new = os.path.join(out, workload, "old"), os.path.join(out, workload, "new")
        for side in (old, new):
            for dirpath, _, names in os.walk(side):
                for n in names:
                    p = os.path.join(dirpath, n)
                    t = UNTOUCHED
                    if side == new and not same(p, os.path.join(old, os.path.relpath(p, new))):
                        t = CHANGED
                    os.utime(p, (t, t), follow_symlinks=False)
            for dirpath, _, _ in os.walk(side, topdown=False):
                os.utime(dirpath, (UNTOUCHED, UNTOUCHED))


def main():
    out = sys.argv[1]
    tree = os.path.join(out, "django-tree/old")
    newer = os.path.join(out, "django-tree/new")
    pictures = files(os.path.join(tree, "docs"), {"png"})
    mailbox(out, tree, pictures)
    book(out, tree, newer)
    document(out, tree, pictures)
    set_times(out)


if __name__ == "__main__":
    main()
