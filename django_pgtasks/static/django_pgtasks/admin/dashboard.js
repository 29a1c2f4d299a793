/* The dashboard refreshes itself while it is open: every few seconds it reads the page
 * again and puts each database's section (queues, chart, failures, stuck tasks, counts,
 * workers) in place of the one shown. It waits while the tab is hidden (Page Visibility
 * API) and refreshes at once when the tab is shown again. Without JavaScript the page is
 * the same, refreshed by reloading it.
 *
 * The interval is the page's data-refresh attribute (seconds); the next read is planned
 * when the last one has ended, so a slow database never gets reads piled up.
 */
'use strict';
{
    const main = document.querySelector('#content-main[data-refresh]');
    if (main) {
        const interval = Number(main.dataset.refresh) * 1000;
        const status = document.getElementById('pgtasks-refresh-status');
        let timer = null;
        let reading = false;

        const setState = (state) => {
            main.dataset.refreshState = state;
            if (status) {
                status.textContent = status.dataset[state] || '';
            }
        };

        const plan = () => {
            clearTimeout(timer);
            timer = document.hidden ? null : setTimeout(refresh, interval);
            setState(document.hidden ? 'paused' : 'waiting');
        };

        const refresh = async () => {
            if (reading || document.hidden) {
                return;
            }
            reading = true;
            try {
                const response = await fetch(window.location.href, {
                    credentials: 'same-origin', headers: {'X-Requested-With': 'XMLHttpRequest'},
                });
                if (!response.ok || response.redirected) {
                    // Logged out, or an error: stop, and leave the page as it was.
                    setState('stopped');
                    return;
                }
                const fresh = new DOMParser().parseFromString(await response.text(), 'text/html');
                fresh.querySelectorAll('section.pgtasks-database').forEach((section) => {
                    const shown = document.getElementById(section.id);
                    if (shown) {
                        shown.replaceWith(document.adoptNode(section));
                    }
                });
                main.dataset.refreshed = String(Number(main.dataset.refreshed || 0) + 1);
            } catch (error) {
                // The server is unreachable for now: try again at the next turn.
            } finally {
                reading = false;
            }
            if (main.dataset.refreshState !== 'stopped') {
                plan();
            }
        };

        document.addEventListener('visibilitychange', () => {
            if (main.dataset.refreshState === 'stopped') {
                return;
            }
            if (document.hidden) {
                plan();
            } else {
                refresh();
            }
        });
        plan();
    }
}
