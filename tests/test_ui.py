"""The notebooks as a user meets them, in a real browser: JupyterLab on the loopback driven by headless Chromium
(Debian's `chromium` and `chromium-driver`, through Selenium), and the docs pages rendered by nbconvert.

JupyterLab opens a notebook that builds the preset picker and runs a tiny training with the live loss plot; the test
runs all its cells, changes the preset and the GPU as a user would (the page's own <select> elements), clicks the
button, and asserts what the page shows. On a failure the page is saved as a screenshot (its path is in the error).

Chromium comes from the system: found on PATH, else installed with apt-get where this runs as root (CI), else the
tests skip and say why."""
import json, os, secrets, shutil, socket, subprocess, sys, tempfile, time, urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip('selenium')
nbformat = pytest.importorskip('nbformat')
pytest.importorskip('jupyterlab')
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

ROOT = Path(__file__).resolve().parents[1]
SHOTS = Path(os.environ.get('LEGALNB_UI_SHOTS', Path(tempfile.gettempdir())/'legalnb-ui-screenshots'))
WAIT = 90   # seconds for anything the page must show (a kernel start and `import legalnb.widgets` included)


def find_chromium() -> tuple[str, str] | str:
    "(browser, driver) paths (installed with apt-get when we are root), else the reason they are missing."
    def found():
        b = shutil.which('chromium') or shutil.which('chromium-browser')
        d = shutil.which('chromedriver')
        return (b, d) if b and d else None
    if got := found(): return got
    if not shutil.which('apt-get'): return 'no chromium/chromedriver on PATH and no apt-get to install them'
    if os.geteuid() != 0:
        return 'no chromium/chromedriver on PATH; as root: apt-get install -y chromium chromium-driver'
    env = {**os.environ, 'DEBIAN_FRONTEND': 'noninteractive'}
    install = ['apt-get', 'install', '-y', '-q', '--no-install-recommends', 'chromium', 'chromium-driver']
    try:
        if subprocess.run(install, env=env, capture_output=True, timeout=900).returncode:
            subprocess.run(['apt-get', 'update', '-q'], env=env, capture_output=True, timeout=300)
            r = subprocess.run(install, env=env, capture_output=True, text=True, timeout=900)
            if r.returncode: return f'apt-get install chromium chromium-driver failed: {r.stderr.strip()[-300:]}'
    except subprocess.TimeoutExpired: return 'apt-get install chromium chromium-driver timed out'
    return found() or 'apt-get installed chromium but chromium/chromedriver are not on PATH'


@pytest.fixture(scope='module')
def browser():
    got = find_chromium()
    if isinstance(got, str): pytest.skip(got)
    opts = Options()
    opts.binary_location = got[0]
    for a in ('--headless=new', '--no-sandbox', '--disable-dev-shm-usage', '--disable-gpu', '--window-size=1400,1200'):
        opts.add_argument(a)
    opts.set_capability('goog:loggingPrefs', {'browser': 'ALL'})   # the page's console, read by console_errors
    driver = webdriver.Chrome(service=Service(got[1]), options=opts)
    driver.set_script_timeout(WAIT * 2)
    yield driver
    driver.quit()


@contextmanager
def screenshot_on_failure(driver, name: str):
    "Save the page as SHOTS/NAME.png when the block fails, and say where in the error."
    try: yield
    except BaseException as e:
        SHOTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(SHOTS/f'{name}.png'))
        raise AssertionError(f'{e} (screenshot: {SHOTS/name}.png)') from e


def console_errors(driver) -> list[str]:
    "Errors the page wrote to the browser console since the last call."
    return [e['message'] for e in driver.get_log('browser') if e['level'] == 'SEVERE']


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0)); return s.getsockname()[1]


UI_CELLS = [
    "from legalnb.widgets import LiveLossPlot, PresetPicker, in_jupyter\n"
    "picker = PresetPicker(task='cpt', preset='fast', gpu='h100-sxm')\npicker",
    # a tiny real training run with the live plot: in a kernel, 'auto' draws one figure redrawn in place
    "import numpy as np, tempfile\nfrom pathlib import Path\nfrom legalnb.train import TrainConfig, train\n"
    "d = Path(tempfile.mkdtemp())\nrng = np.random.default_rng(0)\n"
    "for side, rows in (('train', 64), ('val', 8)):\n"
    "    (d/'split'/side).mkdir(parents=True)\n"
    "    np.save(d/'split'/side/'shard_00000.npy', rng.integers(0, 50, size=(rows, 17)).astype(np.uint16))\n"
    "cfg = TrainConfig(data=str(d/'split'), out=str(d/'run'), dim=16, num_layers=1, num_frequencies=4, vocab_size=50,\n"
    "                  batch_size=4, max_steps=8, log_every=1, eval_every=4, eval_batches=1, save_every=100,\n"
    "                  warmup_steps=1, num_workers=0, progress=False, device='cpu')\n"
    "plot = LiveLossPlot(max_steps=8)\ntrain(cfg, callbacks=[plot])\n"
    "print(f'in_jupyter={in_jupyter()} mode={plot.mode} steps={len(plot.steps)}')",
]


@pytest.fixture(scope='module')
def lab(tmp_path_factory):
    "JupyterLab on 127.0.0.1 with a token, serving a folder holding ui.ipynb; yields (base url, token)."
    root = tmp_path_factory.mktemp('lab')
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in UI_CELLS])
    nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3 (ipykernel)', 'language': 'python'}
    nbformat.write(nb, root/'ui.ipynb')
    port, token = free_port(), secrets.token_hex(16)
    home = root.parent/f'{root.name}-home'
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONPATH': str(ROOT), 'JUPYTER_RUNTIME_DIR': str(home/'runtime'),
           'JUPYTERLAB_WORKSPACES_DIR': str(home/'workspaces'), 'JUPYTERLAB_SETTINGS_DIR': str(home/'settings')}
    env.pop('IN_TEST', None)
    log = open(home.with_suffix('.log'), 'w')
    proc = subprocess.Popen([sys.executable, '-m', 'jupyterlab', '--no-browser', '--ip=127.0.0.1', f'--port={port}',
                             f'--IdentityProvider.token={token}', f'--ServerApp.root_dir={root}',
                             '--LabApp.expose_app_in_browser=True', '--LabApp.news_url=', '--allow-root',
                             '--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate'],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f'http://127.0.0.1:{port}'
    try:
        for _ in range(WAIT * 4):
            if proc.poll() is not None:
                pytest.fail(f'jupyter lab exited: {home.with_suffix(".log").read_text()[-2000:]}')
            try:
                urllib.request.urlopen(f'{url}/api/status?token={token}', timeout=2); break
            except OSError: time.sleep(0.25)
        else: pytest.fail('jupyter lab did not answer on the loopback in time')
        yield url, token
    finally:
        proc.terminate()
        try: proc.wait(15)
        except subprocess.TimeoutExpired: proc.kill()
        log.close()


RUN_ALL = """
const done = arguments[arguments.length - 1];
(async () => {
  const app = window.jupyterapp;
  const panel = app.shell.currentWidget;
  await panel.context.ready; await panel.sessionContext.ready;
  await app.commands.execute('notebook:run-all-cells');
  done('ok');
})().catch(e => done('error: ' + e));
"""


def dropdown(driver, label: str):
    "The <select> of the ipywidgets Dropdown described as `label`."
    return Select(driver.find_element(
        By.XPATH, f"//div[contains(@class,'widget-dropdown')][label[normalize-space()='{label}']]//select"))


def picker_text(driver) -> str:
    "The picker's headline and table as the page shows them."
    for el in driver.find_elements(By.CSS_SELECTOR, '.widget-html-content'):
        if ' on ' in el.text and ('steps' in el.text or 'refused' in el.text): return el.text
    return ''


def picker_plot(driver) -> tuple[str, int]:
    "The plot beside the table: the image's source and its decoded width (0 until it is drawn)."
    img = driver.find_element(By.CSS_SELECTOR, 'img.widget-image')
    return img.get_attribute('src'), driver.execute_script('return arguments[0].naturalWidth', img)


def test_picker_and_live_plot_in_jupyterlab(lab, browser):
    url, token = lab
    wait = WebDriverWait(browser, WAIT, poll_frequency=0.25)
    browser.get(f'{url}/lab/tree/ui.ipynb?token={token}')
    with screenshot_on_failure(browser, 'jupyterlab-picker'):
        wait.until(lambda d: d.execute_script(
            'const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;'
            'return !!(w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel)'))
        assert browser.execute_async_script(RUN_ALL) == 'ok'
        wait.until(lambda d: 'cpt/fast on 4 × NVIDIA H100 SXM5 80GB' in picker_text(d))
        first = picker_text(browser)
        assert 'steps' in first and '$' in first and '<b>' not in first and '<pre>' not in first
        wait.until(lambda d: picker_plot(d)[1] > 0)
        src, _ = picker_plot(browser)

        dropdown(browser, 'preset').select_by_visible_text('full')            # the estimate changes
        wait.until(lambda d: 'cpt/full on 4' in picker_text(d))
        assert picker_text(browser) != first and '40,000 steps' in picker_text(browser)

        dropdown(browser, 'GPU').select_by_visible_text('a100-80gb')          # and the plot redraws
        wait.until(lambda d: 'NVIDIA A100 80GB' in picker_text(d) and picker_plot(d)[0] != src)
        wait.until(lambda d: picker_plot(d)[1] > 0)   # the new image decoded (its width is 0 for a moment under load)
        fields = [e.text for e in browser.find_elements(By.CSS_SELECTOR, '.widget-inline-hbox label.widget-label')
                  if e.is_displayed()]
        assert 'params (B)' in fields and 'examples' not in fields and 'size' not in fields  # cpt's fields only

        browser.find_element(By.XPATH, "//button[normalize-space()='Use this preset']").click()
        wait.until(lambda d: any(e.text.startswith('TrainingArguments: 40,000 steps')
                                 for e in d.find_elements(By.CSS_SELECTOR, '.widget-html-content')))

        # the live plot: one image in the training cell's output, redrawn in place, and the kernel knew it was one
        wait.until(lambda d: 'in_jupyter=True mode=plot steps=8' in d.find_element(By.TAG_NAME, 'body').text)
        cell = browser.find_elements(By.CSS_SELECTOR, '.jp-Notebook .jp-Cell')[1]
        images = cell.find_elements(By.CSS_SELECTOR, '.jp-OutputArea img')
        assert len(images) == 1 and browser.execute_script('return arguments[0].naturalWidth', images[0]) > 0
        assert not cell.find_elements(By.CSS_SELECTOR, '[data-mime-type="application/vnd.jupyter.stderr"]')
        errors = console_errors(browser)
        assert not errors, f'browser console errors: {errors}'


@pytest.mark.parametrize('name', ['index.ipynb', '12_resonance.ipynb', '23_widgets.ipynb'])
def test_docs_pages_render_in_the_browser(name, browser, tmp_path):
    "The stored notebook rendered to HTML by nbconvert reads as a page: images load, no raw markup, no temp paths."
    r = subprocess.run([sys.executable, '-m', 'jupyter', 'nbconvert', '--to', 'html', '--output-dir', str(tmp_path),
                        str(ROOT/'nbs'/name)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-1000:]
    browser.get((tmp_path/name).with_suffix('.html').as_uri())
    with screenshot_on_failure(browser, f'nbconvert-{Path(name).stem}'):
        WebDriverWait(browser, 30).until(lambda d: d.execute_script('return document.readyState') == 'complete')
        shown = browser.find_elements(By.CSS_SELECTOR, '.jp-OutputArea-output, .jp-RenderedMarkdown')
        text = '\n'.join(e.text for e in shown)
        assert len(text) > 500, f'{name}: the page shows almost nothing outside its code'   # what a reader reads
        for bad in ('<Figure size', '/tmp/', '<b>', '<pre>', '](loss.png)'):
            assert bad not in text, f'{name}: the page shows {bad!r}'
        widths = browser.execute_script("return [...document.images].map(i => i.complete ? i.naturalWidth : -1)")
        assert widths and all(w > 0 for w in widths), f'{name}: images that do not load: {widths}'
        assert browser.find_elements(By.TAG_NAME, 'h1')
