# attnscope on CPU: docker build -t attnscope . && docker run -p 8000:8000 attnscope
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 \
    ATTNSCOPE_HOST=0.0.0.0 ATTNSCOPE_PORT=8000
WORKDIR /srv/attnscope
# the CPU build of torch first, from PyTorch's CPU index: no CUDA download
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY app app
COPY model model
COPY static static
COPY templates templates
# pyproject.toml maps the four folders above into the package: installed, they are attnscope.app, …
COPY attnscope attnscope
RUN pip install --no-cache-dir -e . && useradd --create-home attnscope
USER attnscope
EXPOSE 8000
CMD ["attnscope", "serve", "--host", "0.0.0.0", "--port", "8000"]
